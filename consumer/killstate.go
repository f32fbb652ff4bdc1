package consumer

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/cenkalti/backoff/v3"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/statequeue"
	"github.com/warrenmq/warren/kill"
)

// recall sets the mode from the kill state queue, which holds the last command a kill.Killer
// sent, for a subscription that starts (or reconnects). Listening has begun already, so no
// command falls in between: a Killer writes the state before it publishes the command.
// A state that does not exist means the queue was never killed. The state is not subject to
// KillMaxAge (it is remembered for ever), only to KillClockSkew.
func (sub *subscription) recall(ctx context.Context, conn *amqp.Connection) error {
	c, body, found, err := sub.readState(ctx, conn)
	if err != nil || found == unknown {
		return err
	}
	before := sub.mode
	switch {
	case found == absent && sub.mode != draining: // a drain goes on: its end removes the state
		sub.mode = running
	case found == present && c.At.After(sub.last):
		sub.last = c.At
		sub.mode = map[kill.Action]mode{kill.Stop: paused, kill.Delete: draining, kill.Resume: running}[c.Action]
	}
	if sub.mode != before {
		sub.event(modeState[sub.mode], amqp.Delivery{Body: body}, nil)
	}
	return nil
}

// stateFound is what reading the kill state queue found.
type stateFound int

const (
	absent  stateFound = iota // no state queue, or no valid command in it: never killed
	present                   // a valid command
	unknown                   // closed while reading
)

// readState returns the newest valid command of the kill state queue and its JSON, and
// removes the valid commands it supersedes (see newest and statequeue.Settle), holding the
// state's lock (statequeue.Lock). It reads once no command of the queue is out (see
// statequeue.Read: a reader that lost its connection gives the lock back before the broker
// returns what it held). A state queue that does not exist is found so without the lock
// (statequeue.Exists): most queues were never killed. A state queue that exists holds a
// command; if it looks empty, it is read again, for up to ConnectTimeout.
func (sub *subscription) readState(ctx context.Context, conn *amqp.Connection) (c kill.Command, body []byte, found stateFound, err error) {
	s := sub.s
	name := kill.StateQueue(sub.queue, s.cfg.KillSecret)
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 5 * time.Millisecond
	b.MaxInterval = 200 * time.Millisecond
	b.MaxElapsedTime = s.cfg.Connection.ConnectTimeout
	for {
		got, missing := false, false
		err := func() error {
			opCtx, cancel := context.WithTimeout(ctx, s.cfg.Connection.ConnectTimeout)
			defer cancel()
			if exists, err := statequeue.Exists(opCtx, conn, name); err != nil || !exists {
				missing = err == nil
				return err
			}
			unlock, err := statequeue.Lock(opCtx, conn, kill.LockQueue(sub.queue))
			if err != nil {
				return err
			}
			defer unlock()
			return statequeue.OnChannel(conn, func(ch *amqp.Channel) error {
				ds, err := statequeue.Read(opCtx, ch, name, statequeue.ReadMax)
				if err != nil || len(ds) == 0 {
					return err
				}
				got = true
				var stale []amqp.Delivery
				c, body, found, stale = sub.newest(ds)
				return statequeue.Settle(opCtx, ch, name, ds, stale, body)
			})
		}()
		switch {
		case missing || amqpx.IsNotFound(err):
			return kill.Command{}, nil, absent, nil
		case ctx.Err() != nil:
			return kill.Command{}, nil, unknown, nil
		case err != nil:
			return kill.Command{}, nil, absent, fmt.Errorf("read %s: %w", name, err)
		case got:
			return c, body, found, nil
		}
		wait := b.NextBackOff()
		if wait == backoff.Stop {
			s.logger.Error("Kill state queue stays empty: taken as never killed", nil,
				watermill.LogFields{"queue": sub.queue, "state_queue": name, "for": s.cfg.Connection.ConnectTimeout})
			return c, nil, absent, nil
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return c, nil, unknown, nil
		case <-s.closing:
			return c, nil, unknown, nil
		}
	}
}

// newest returns the newest of the commands read from the state that passes verification
// (any age, but not dated ahead), and the valid ones it supersedes (stale); the invalid ones
// are reported as refused.
func (sub *subscription) newest(ds []amqp.Delivery) (c kill.Command, body []byte, found stateFound, stale []amqp.Delivery) {
	s := sub.s
	var valid []amqp.Delivery
	var ats []time.Time
	for _, d := range ds {
		var x kill.Command
		err := json.Unmarshal(d.Body, &x)
		if err == nil {
			err = x.Verify(sub.queue, s.cfg.KillSecret, time.Now(), 0, s.cfg.KillClockSkew)
		}
		if err != nil {
			sub.event(refused, d, fmt.Errorf("kill state: %w", err))
			continue
		}
		valid, ats = append(valid, d), append(ats, x.At)
		if found == absent || x.At.After(c.At) {
			c, body, found = x, d.Body, present
		}
	}
	for i, d := range valid {
		if ats[i].Before(c.At) {
			stale = append(stale, d)
		}
	}
	return c, body, found, stale
}
