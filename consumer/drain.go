package consumer

import (
	"context"
	"errors"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/statequeue"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/topology"
)

// drainCheck is how often a draining subscription looks whether its queue is empty.
const drainCheck = 100 * time.Millisecond

// awaitDeletion follows a drained subscription, its consumer cancelled: it deletes the queue
// once no consumer is left and it is empty (the broker refuses otherwise: nothing is lost),
// and reports gone once the queue no longer exists. If messages arrived and nobody consumes
// them, it returns gone=false: the caller consumes again.
func (sub *subscription) awaitDeletion(ctx context.Context, conn *amqp.Connection) (gone bool, err error) {
	for {
		q, err := inspect(conn, sub.consumed)
		var ae *amqp.Error
		switch {
		case errors.As(err, &ae) && ae.Code == amqp.NotFound:
			return true, errQueueGone
		case err != nil:
			return false, err
		case q.Consumers == 0 && q.Messages > 0:
			return false, nil
		case q.Consumers == 0:
			if sub.deleteIfIdle(conn, sub.consumed, true) == nil {
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
	err = statequeue.OnChannel(conn, func(ch *amqp.Channel) error {
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
		return statequeue.OnChannel(conn, func(ch *amqp.Channel) error {
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
	return statequeue.OnChannel(conn, func(ch *amqp.Channel) error {
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
			_ = statequeue.OnChannel(conn, op)
		}
	}
	sub.event("deleted", amqp.Delivery{}, nil)
}
