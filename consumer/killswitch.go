package consumer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
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
		err := amqpx.DeclareCounter(ch, name)
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
	if err == nil && c.At.Before(sub.last) {
		// Superseded: heard after a newer one was read from the kill state (a subscription
		// that started between a stop and its resume hears both after reading the resume).
		sub.answer(d, before, sub.mode, nil)
		return
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

// event logs what the subscription did and tells Config.OnKill.
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
