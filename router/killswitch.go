package router

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/topology"
)

// drainCheck is how often a draining subscription looks whether its queue is empty.
const drainCheck = 100 * time.Millisecond

// listen binds an exclusive queue of the subscription's own to the kill exchange of its
// queue and returns the commands that arrive, and a function that stops listening.
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
	return deliveries, func() { _ = ch.Close() }, nil
}

// recall sets the mode from the markers a kill leaves, for a subscription that starts (or
// reconnects) after it. Listening has begun already, so no command falls in between.
func (sub *subscription) recall(conn *amqp.Connection) error {
	secret := sub.s.cfg.KillSecret
	deleting, err := exchangeExists(conn, killMarker(sub.queue, Delete, secret))
	if err != nil {
		return err
	}
	stopped, err := exchangeExists(conn, killMarker(sub.queue, Stop, secret))
	if err != nil {
		return err
	}
	before := sub.mode
	switch {
	case deleting:
		sub.mode = draining
	case stopped:
		sub.mode = paused
	default:
		sub.mode = running
	}
	if sub.mode != before {
		sub.event(map[mode]string{running: "resumed", paused: "stopped", draining: "draining"}[sub.mode], amqp.Delivery{}, nil)
	}
	return nil
}

func exchangeExists(conn *amqp.Connection, name string) (bool, error) {
	err := onChannel(conn, func(ch *amqp.Channel) error {
		return ch.ExchangeDeclarePassive(name, amqp.ExchangeFanout, true, false, false, false, nil)
	})
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return false, nil
	}
	return err == nil, err
}

// onChannel runs op on a channel of its own: a refusal closes the channel it comes on.
func onChannel(conn *amqp.Connection, op func(ch *amqp.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return op(ch)
}

// command applies a command of the kill topic to the mode, if it passes verification.
func (sub *subscription) command(d amqp.Delivery) {
	s := sub.s
	var c Command
	err := json.Unmarshal(d.Body, &c)
	if err == nil {
		err = c.verify(sub.queue, s.cfg.KillSecret, s.cfg.KillMaxAge, time.Now())
	}
	if err == nil && len(s.cfg.KillSecret) > 0 && !c.At.After(sub.last) {
		err = errors.New("not newer than the last command accepted: a replay")
	}
	if err != nil {
		sub.event("refused", d, err)
		return
	}
	sub.last = c.At
	switch {
	case c.Action == Stop:
		sub.mode = paused // the caller stops consuming and reports it
	case c.Action == Delete && sub.mode != draining:
		sub.mode = draining
		sub.event("draining", d, nil)
	case c.Action == Resume && sub.mode != running:
		sub.mode = running
		sub.event("resumed", d, nil)
	}
}

// event logs what the subscription did and tells Config.OnKill.
func (sub *subscription) event(state string, d amqp.Delivery, err error) {
	s := sub.s
	e := KillEvent{Queue: sub.queue, Handler: s.cfg.HandlerName, State: state, At: time.Now(), Err: err}
	var c Command
	if json.Unmarshal(d.Body, &c) == nil {
		e.Action = c.Action
	}
	fields := watermill.LogFields{"queue": sub.queue, "handler": s.cfg.HandlerName, "state": state, "action": e.Action}
	if err != nil {
		s.logger.Error("Kill command refused", err, fields)
	} else {
		s.logger.Info("Kill topic", fields)
	}
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
			if deleteQueue(conn, sub.queue) == nil {
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
	err = onChannel(conn, func(ch *amqp.Channel) error {
		q, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err
	})
	return q, err
}

// deleteQueue deletes queue if it is unused and empty.
func deleteQueue(conn *amqp.Connection, queue string) error {
	return onChannel(conn, func(ch *amqp.Channel) error {
		_, err := ch.QueueDelete(queue, true, true, false)
		return err
	})
}

// removeKilled removes, after a delete command emptied and deleted the queue, what belonged
// to it where nothing else uses it: its poison queue if empty, its kill exchange if no other
// consumer listens, and the markers.
func (sub *subscription) removeKilled() {
	s := sub.s
	conn, err := s.connection()
	if err == nil {
		for _, op := range []func(ch *amqp.Channel) error{
			func(ch *amqp.Channel) error {
				_, err := ch.QueueDelete(topology.PoisonQueue(sub.queue), false, true, false)
				return err
			},
			func(ch *amqp.Channel) error { return ch.ExchangeDelete(topology.KillExchange(sub.queue), true, false) },
			func(ch *amqp.Channel) error {
				return ch.ExchangeDelete(killMarker(sub.queue, Delete, s.cfg.KillSecret), false, false)
			},
			func(ch *amqp.Channel) error {
				return ch.ExchangeDelete(killMarker(sub.queue, Stop, s.cfg.KillSecret), false, false)
			},
		} {
			_ = onChannel(conn, op)
		}
	}
	sub.event("deleted", amqp.Delivery{}, nil)
}
