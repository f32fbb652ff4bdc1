package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/statequeue"
)

// State is what the active scheduler of a group records after each tick it publishes.
type State struct {
	// Jobs by name.
	Jobs map[string]JobState `json:"jobs"`
	// By names the scheduler that wrote it: host and process id.
	By string `json:"by"`
	// At is when it was written.
	At time.Time `json:"at"`
}

// JobState is a job's entry in State.
type JobState struct {
	Schedule string `json:"schedule"`
	Topic    string `json:"topic"`
	// Next is the latest tick published: it waits in the delay levels until it is due.
	Next time.Time `json:"next"`
	// Missed counts the ticks that were missed and not published (Skip, or beyond
	// MaxCatchUp).
	Missed int `json:"missed,omitempty"`
}

// readState reads the newest state of the group's state queue, and puts every message back.
func (s *Scheduler) readState(ctx context.Context, ch *amqp.Channel) (State, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	st, err := newestState(ctx, ch, StateQueue(s.cfg.Prefix, s.cfg.Name))
	if err != nil {
		return st, fmt.Errorf("scheduler: read state: %w", err)
	}
	return st, nil
}

// newestState gets the messages of queue (one or two), puts them back, and returns the
// newest state among them; an empty State if there is none.
func newestState(ctx context.Context, ch *amqp.Channel, queue string) (State, error) {
	st := State{Jobs: map[string]JobState{}}
	ds, err := statequeue.Get(ctx, ch, queue, statequeue.ReadMax)
	if len(ds) > 0 {
		last := ds[len(ds)-1].DeliveryTag
		defer func() { _ = ch.Nack(last, true, true) }()
	}
	if err != nil {
		return st, err
	}
	for _, d := range ds {
		var c State
		if json.Unmarshal(d.Body, &c) == nil && c.Jobs != nil && c.At.After(st.At) {
			st = c
		}
	}
	return st, nil
}

// writeState publishes st as the group's newest state, confirmed on conf.
func (s *Scheduler) writeState(ctx context.Context, conf *amqpx.Confirmer, st State) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	host, _ := os.Hostname()
	st.By, st.At = fmt.Sprintf("%s/%d", host, os.Getpid()), time.Now()
	body, err := json.Marshal(st)
	if err != nil {
		return err
	}
	f, err := conf.Publish(ctx, "", StateQueue(s.cfg.Prefix, s.cfg.Name), true,
		amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body})
	if err == nil {
		err = f.Wait(ctx)
	}
	if err != nil {
		return fmt.Errorf("scheduler: write state: %w", err)
	}
	return nil
}

// Group is what ReadGroup tells of a group of schedulers.
type Group struct {
	State
	// Schedulers is the number of schedulers that take part now (consumers of the lock
	// queue; one of them is active).
	Schedulers int `json:"schedulers"`
}

// ReadGroup returns the state of group name (queues named with prefix) on conn, without
// taking part in it: found is false when the group has no lock queue.
func ReadGroup(ctx context.Context, conn *amqp.Connection, prefix, name string) (g Group, found bool, err error) {
	err = statequeue.OnChannel(conn, func(ch *amqp.Channel) error {
		return amqpx.Do(ctx, ch, func() error {
			q, err := ch.QueueDeclarePassive(LockQueue(prefix, name), true, false, false, false, nil)
			g.Schedulers = q.Consumers
			return err
		})
	})
	if amqpx.IsNotFound(err) {
		return g, false, nil
	}
	if err != nil {
		return g, false, err
	}
	err = statequeue.OnChannel(conn, func(ch *amqp.Channel) error {
		g.State, err = newestState(ctx, ch, StateQueue(prefix, name))
		return err
	})
	if err != nil && !amqpx.IsNotFound(err) {
		return g, true, err
	}
	return g, true, nil
}
