package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/killstate"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/topology"
)

// KillEvent tells what a consumer did about the kill topic.
type KillEvent struct {
	Queue   string
	Handler string
	// State: "stopped" (no longer taking messages, nothing in flight), "resumed",
	// "draining" (taking messages until the queue is empty), "deleted" (the queue is gone,
	// the consumer ended), or "refused" (a command that failed verification; Err says why).
	State string
	// Action of the command that caused it, received or, when the subscription started,
	// read from the kill state queue.
	Action kill.Action
	At     time.Time
	Err    error
}

// refused is the state of a KillEvent, and of a kill.Answer, about a command that failed
// verification.
const refused = "refused"

// replyTimeout bounds a consumer's publish of a kill.Answer.
const replyTimeout = 5 * time.Second

// drainCheck is how often a draining subscription looks whether its queue is empty.
const drainCheck = 100 * time.Millisecond

// listen binds an exclusive queue of the subscription's own to the kill exchange of its
// queue, then has itself counted (see count), and returns the commands that arrive, and a
// function that stops listening.
func (sub *subscription) listen(conn *amqp.Connection) (<-chan amqp.Delivery, func(), error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, nil, err
	}
	kill := topology.KillExchange(sub.queue)
	deliveries, err := func() (<-chan amqp.Delivery, error) {
		if err := ch.ExchangeDeclare(kill, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
			return nil, err
		}
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		if err != nil {
			return nil, err
		}
		if err := ch.QueueBind(q.Name, "", kill, false, nil); err != nil {
			return nil, err
		}
		return ch.Consume(q.Name, "", true, true, false, false, nil)
	}()
	if err != nil {
		_ = ch.Close()
		return nil, nil, err
	}
	uncount := sub.count(conn)
	return deliveries, func() { uncount(); _ = ch.Close() }, nil
}

// listenerArgs declare a kill listener queue (kill.ListenerQueue): classic, the only type
// that can be auto-deleted, and refusing every message (a length limit of 0 with
// reject-publish, on RabbitMQ 3.10.8 and 4.0.5 alike: nothing is stored or delivered), so
// that nobody can make it hold or hand out anything.
var listenerArgs = amqp.Table{"x-queue-type": "classic", "x-max-length": int32(0), "x-overflow": "reject-publish"}

// listenerCountLimit bounds how long a subscription that starts waits to be counted among
// its queue's kill listeners.
const listenerCountLimit = time.Second

// count makes the subscription one of the consumers of its queue's kill listener queue
// (kill.ListenerQueue), on a channel of its own, and returns the function that ends it. A
// Killer reads that queue's consumer count to know how many subscriptions will answer a
// command: a stopped one has no consumer on the work queue, so its count does not show
// them. It is called once the subscription listens, so every subscription counted hears
// the commands published after the count. Counting is best effort: a failure is logged,
// and a Killer then waits its full Wait for the subscriptions it cannot count.
func (sub *subscription) count(conn *amqp.Connection) func() {
	ch, err := conn.Channel()
	if err != nil {
		sub.notCounted(err)
		return func() {}
	}
	// The queue lives on one node: while that node is down, a declare of it from another
	// node waits until it is back (seen on a RabbitMQ 4.0.5 cluster), and so would closing the
	// channel. A consumer that failed over goes on after listenerCountLimit, uncounted; the
	// channel is closed once the declare has returned.
	result := make(chan error, 1)
	go func() {
		name := kill.ListenerQueue(sub.queue)
		_, err := ch.QueueDeclare(name, true, true, false, false, listenerArgs)
		if err == nil {
			_, err = ch.Consume(name, "", true, false, false, false, nil)
		}
		result <- err
	}()
	select {
	case err := <-result:
		if err != nil {
			_ = ch.Close()
			sub.notCounted(err)
			return func() {}
		}
		return func() { _ = ch.Close() }
	case <-time.After(listenerCountLimit):
		sub.notCounted(fmt.Errorf("no answer within %s", listenerCountLimit))
		return func() {
			go func() {
				if err := <-result; err != nil { // the declare has returned: the channel can close
					sub.s.logger.Debug("Kill listener count ended", watermill.LogFields{"queue": sub.queue, "err": err.Error()})
				}
				_ = ch.Close()
			}()
		}
	}
}

// notCounted logs that the subscription is not counted among the kill listeners.
func (sub *subscription) notCounted(err error) {
	sub.s.logger.Info("Kill listener not counted: a kill or resume waits for all of its Wait",
		watermill.LogFields{"queue": sub.queue, "handler": sub.s.cfg.HandlerName, "err": err.Error()})
}

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
// removes the valid commands it supersedes (see newest and killstate.Settle), holding the
// state's lock (killstate.Lock). It reads once no command of the queue is out (see
// killstate.Read: a reader that lost its connection gives the lock back before the broker
// returns what it held). A state queue that exists holds a command; if it looks empty, it is
// read again, for up to ConnectTimeout.
func (sub *subscription) readState(ctx context.Context, conn *amqp.Connection) (c kill.Command, body []byte, found stateFound, err error) {
	s := sub.s
	name := kill.StateQueue(sub.queue, s.cfg.KillSecret)
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 5 * time.Millisecond
	b.MaxInterval = 200 * time.Millisecond
	b.MaxElapsedTime = s.cfg.Connection.ConnectTimeout
	for {
		got := false
		err := func() error {
			opCtx, cancel := context.WithTimeout(ctx, s.cfg.Connection.ConnectTimeout)
			defer cancel()
			unlock, err := killstate.Lock(opCtx, conn, kill.LockQueue(sub.queue))
			if err != nil {
				return err
			}
			defer unlock()
			return killstate.OnChannel(conn, func(ch *amqp.Channel) error {
				ds, err := killstate.Read(opCtx, ch, name, killstate.ReadMax)
				if err != nil || len(ds) == 0 {
					return err
				}
				got = true
				var stale []amqp.Delivery
				c, body, found, stale = sub.newest(ds)
				return killstate.Settle(opCtx, ch, name, ds, stale, body)
			})
		}()
		switch {
		case amqpx.IsNotFound(err):
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

// command applies a command of the kill topic to the mode, if it passes verification. The
// command last accepted (maybe read from the state) is ignored; with a secret, an older one
// is refused as a replay (without one, any command can be forged anyway). A live command is
// answered (see kill.Answer), but a stop that the caller carries out: it answers once stopped.
func (sub *subscription) command(d amqp.Delivery) {
	s := sub.s
	before := sub.mode
	var c kill.Command
	err := json.Unmarshal(d.Body, &c)
	if err == nil {
		err = c.Verify(sub.queue, s.cfg.KillSecret, time.Now(), s.cfg.KillMaxAge, s.cfg.KillClockSkew)
	}
	if err == nil && c.At.Equal(sub.last) {
		sub.answer(d, before, sub.mode, nil) // seen already (in the state): in force
		return
	}
	if err == nil && len(s.cfg.KillSecret) > 0 && c.At.Before(sub.last) {
		err = errors.New("older than the last command accepted: a replay")
	}
	if err != nil {
		sub.event(refused, d, err)
		sub.answer(d, before, before, err)
		return
	}
	if c.At.After(sub.last) {
		sub.last = c.At
	}
	switch {
	case c.Action == kill.Stop && before == paused:
		sub.answer(d, before, paused, nil)
	case c.Action == kill.Stop:
		sub.mode = paused // the caller stops consuming, reports and answers it
	case c.Action == kill.Delete && before != draining:
		sub.mode = draining
		sub.event("draining", d, nil)
		sub.answer(d, before, draining, nil)
	case c.Action == kill.Resume && before != running:
		sub.mode = running
		sub.event("resumed", d, nil)
		sub.answer(d, before, running, nil)
	default: // in that state already
		sub.answer(d, before, sub.mode, nil)
	}
}

// modeState names the state of a mode in events and answers.
var modeState = map[mode]string{running: "resumed", paused: "stopped", draining: "draining"}

// replyPrefix starts the names the broker gives the queues it names: no client can declare
// one, so an answer sent to one can never land in a work queue.
const replyPrefix = "amq.gen-"

// answer publishes a kill.Answer to the reply address of d, a live command, if it has one,
// saying the subscription is in mode now (or refused it, when refusal is set) and was in
// before when the command came. It never blocks: the publish runs in a goroutine of its own,
// on a channel of its own of the publishing connection (see consumerConns), without
// confirmation, and a failure is only logged (debug).
func (sub *subscription) answer(d amqp.Delivery, before, now mode, refusal error) {
	if d.ReplyTo == "" { // a command without a reply address, or read from the state
		return
	}
	s := sub.s
	fields := watermill.LogFields{"queue": sub.queue, "handler": s.cfg.HandlerName, "reply_to": d.ReplyTo}
	if !strings.HasPrefix(d.ReplyTo, replyPrefix) {
		s.logger.Debug("Kill command not answered: its reply address is not a server-named queue", fields)
		return
	}
	a := kill.Answer{Queue: sub.queue, State: modeState[now], Consuming: before != paused}
	trusted := len(s.cfg.KillSecret) == 0
	if !trusted {
		var c kill.Command
		err := json.Unmarshal(d.Body, &c)
		if err == nil {
			err = c.VerifyReply(s.cfg.KillSecret, d.ReplyTo, d.CorrelationId)
		}
		trusted = err == nil
		if !trusted && refusal == nil {
			s.logger.Debug("Kill command obeyed but not answered", fields.Add(watermill.LogFields{"err": err.Error()}))
			return
		}
	}
	if trusted { // who answers, only to a sender who may know
		p := self()
		a.Handler, a.Host, a.PID, a.Process, a.Instance = s.cfg.HandlerName, p.host, p.pid, p.id, sub.id
	}
	if refusal != nil {
		a.State, a.Error = refused, refusal.Error()
	}
	if len(s.cfg.KillSecret) > 0 {
		a.Sign(s.cfg.KillSecret, d.CorrelationId)
	}
	body, err := json.Marshal(a)
	if err != nil {
		return
	}
	replyTo, correlationID := d.ReplyTo, d.CorrelationId
	s.answering.Add(1)
	go func() {
		defer s.answering.Done()
		ctx, cancel := context.WithTimeout(context.Background(), replyTimeout)
		defer cancel()
		conn, err := s.conns.publish.Get(ctx) // a router's publishing connection: see consumerConns
		if err == nil {
			err = killstate.OnChannel(conn, func(ch *amqp.Channel) error {
				return ch.PublishWithContext(ctx, "", replyTo, false, false, amqp.Publishing{
					ContentType: "application/json", CorrelationId: correlationID, Body: body, Timestamp: time.Now(),
				})
			})
		}
		if err != nil {
			s.logger.Debug("Kill answer not published", fields.Add(watermill.LogFields{"err": err.Error()}))
		}
	}()
}

// process identifies this process in answers.
type process struct {
	host string
	pid  int
	id   string // random: pids repeat across hosts, containers and restarts
}

var self = sync.OnceValue(func() process {
	host, _ := os.Hostname()
	return process{host: host, pid: os.Getpid(), id: killstate.NewID()}
})

// event logs what the subscription did and tells SubscriberConfig.OnKill.
func (sub *subscription) event(state string, d amqp.Delivery, err error) {
	s := sub.s
	e := KillEvent{Queue: sub.queue, Handler: s.cfg.HandlerName, State: state, At: time.Now(), Err: err}
	var c kill.Command
	if json.Unmarshal(d.Body, &c) == nil {
		e.Action = c.Action
	}
	fields := watermill.LogFields{"queue": sub.queue, "handler": s.cfg.HandlerName, "state": state, "action": e.Action}
	if err != nil {
		s.logger.Error("Kill command refused", err, fields)
	} else {
		s.logger.Info("Kill topic", fields)
	}
	s.metrics.KillEvent(context.Background(), sub.queue, string(e.Action), state)
	if s.cfg.OnKill != nil {
		s.cfg.OnKill(e)
	}
}

// awaitDeletion follows a drained subscription, its consumer cancelled: it deletes the queue
// once no consumer is left and it is empty (the broker refuses otherwise: nothing is lost),
// and reports gone once the queue no longer exists. If messages arrived and nobody consumes
// them, it returns gone=false: the caller consumes again.
func (sub *subscription) awaitDeletion(ctx context.Context, conn *amqp.Connection) (gone bool, err error) {
	for {
		q, err := inspect(conn, sub.queue)
		var ae *amqp.Error
		switch {
		case errors.As(err, &ae) && ae.Code == amqp.NotFound:
			return true, errQueueGone
		case err != nil:
			return false, err
		case q.Consumers == 0 && q.Messages > 0:
			return false, nil
		case q.Consumers == 0:
			if sub.deleteIfIdle(conn, sub.queue, true) == nil {
				return true, errQueueGone
			}
		}
		select {
		case <-time.After(drainCheck):
		case <-ctx.Done():
			return false, nil
		case <-sub.s.closing:
			return false, nil
		}
	}
}

func inspect(conn *amqp.Connection, queue string) (q amqp.Queue, err error) {
	err = killstate.OnChannel(conn, func(ch *amqp.Channel) error {
		q, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err
	})
	return q, err
}

// errNotIdle is deleteIfIdle's answer for a queue that is in use or holds messages.
var errNotIdle = errors.New("the queue is in use or holds messages")

// deleteIfIdle deletes queue (the subscription's work queue, or its poison queue) if it holds
// no message and, when unused is set, has no consumer. The broker deletes a classic queue on
// those conditions itself (if-empty, if-unused): nothing can be lost. It cannot for a quorum
// queue (540 NOT_IMPLEMENTED, which closes the connection, on 3.10 and 4.0): that is checked
// and then deleted, so a message published in the milliseconds between is deleted with it;
// that is logged, with the count. Stop publishing to a queue before deleting it.
func (sub *subscription) deleteIfIdle(conn *amqp.Connection, queue string, unused bool) error {
	if sub.s.builder.QueueType(sub.s.queue(sub.queue)) != topology.Quorum {
		return killstate.OnChannel(conn, func(ch *amqp.Channel) error {
			_, err := ch.QueueDelete(queue, unused, true, false)
			return err
		})
	}
	st, err := inspect(conn, queue)
	switch {
	case err != nil:
		return err
	case st.Messages > 0 || unused && st.Consumers > 0:
		return errNotIdle
	}
	return killstate.OnChannel(conn, func(ch *amqp.Channel) error {
		n, err := ch.QueueDelete(queue, false, false, false)
		if n > 0 {
			sub.s.logger.Error("Messages published while the queue was deleted were deleted with it", nil,
				watermill.LogFields{"queue": queue, "messages": n})
		}
		return err
	})
}

// removeKilled removes, after a delete command emptied and deleted the queue, what belonged
// to it where nothing else uses it: its poison queue if empty, its kill exchange if no other
// consumer listens, and its kill state queue.
func (sub *subscription) removeKilled() {
	s := sub.s
	conn, err := s.connection(context.Background())
	if err == nil {
		_ = sub.deleteIfIdle(conn, topology.PoisonQueue(sub.queue), false)
		for _, op := range []func(ch *amqp.Channel) error{
			func(ch *amqp.Channel) error { return ch.ExchangeDelete(topology.KillExchange(sub.queue), true, false) },
			func(ch *amqp.Channel) error {
				_, err := ch.QueueDelete(kill.StateQueue(sub.queue, s.cfg.KillSecret), false, false, false)
				return err
			},
		} {
			_ = killstate.OnChannel(conn, op)
		}
	}
	sub.event("deleted", amqp.Delivery{}, nil)
}
