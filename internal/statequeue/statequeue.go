// Package statequeue is the broker plumbing of a state queue: a short durable queue whose
// newest message is a component's state, read and written by processes that take turns
// through a lock (an exclusive consumer of a lock queue of its own). A reader gets the
// messages, takes the newest and puts them back; a writer replaces them. The kill switch keeps
// a work queue's last command so (package kill writes it, package consumer's subscriptions
// read it when they start), and the scheduler keeps its state so; NewID makes the ids that
// the ledger and the scheduler write. The queues' names, and what a message means, are the
// using package's (kill.StateQueue and kill.LockQueue, say).
package statequeue

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
)

// Args declare a state queue: durable (quorum), and short. A writer publishes the new state
// and then acks what it read, but x-max-length 1 with reject-publish does not keep it to
// one (measured on RabbitMQ 3.10.8 and 4.0.5: a quorum queue refuses a publish only once it
// is over the limit, so two fit, and the messages a reader holds do not count): it only
// bounds what can be slipped in. Readers therefore read several messages and take the
// newest. A refused message that is read is requeued, which counts as a delivery: the limit
// is the largest that means "unlimited" both on RabbitMQ 3.10 (where -1 drops a message
// after its first return) and 4.x.
var Args = amqp.Table{
	amqp.QueueTypeArg:  amqp.QueueTypeQuorum,
	"x-max-length":     int64(1),
	"x-overflow":       "reject-publish",
	"x-delivery-limit": int64(math.MaxInt32),
}

// Lock takes the lock of a state queue, which readers and writers hold while they read
// or write it, and returns the function that releases it. The lock is an exclusive consumer
// of lockQueue, a queue of its own (auto-deleted, and expiring in case its holder dies
// between declaring and consuming it: x-expires counts only time without a consumer, so it
// never ends a lock that is held; its name does not match the state's, so that
// permissions can keep apart who may declare which), on a channel that releasing closes, as
// losing the connection does. Without it, a reader can miss a state written while another
// reader holds the previous one, and read only older ones (measured: docs/decisions.md). A
// holder's messages are not all back when the lock is released: see Read. Contention is
// waited out, for as long as ctx lasts.
func Lock(ctx context.Context, conn *amqp.Connection, lockQueue string) (unlock func(), err error) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 2*time.Millisecond, 50*time.Millisecond, 0
	for {
		unlock, err := TryLock(ctx, conn, lockQueue)
		if err == nil || ctx.Err() != nil || !refused(err) {
			return unlock, err
		}
		select {
		case <-time.After(b.NextBackOff()):
		case <-ctx.Done():
			return nil, fmt.Errorf("lock %s: %w (last refusal: %v)", lockQueue, ctx.Err(), err)
		}
	}
}

// refused reports whether err is the broker's refusal of a lock: held by another (403,
// 405), or just deleted by its last holder (404). A channel or connection that is not open
// (504) is no refusal: waiting on it would only wait out ctx.
func refused(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && (ae.Code == amqp.AccessRefused || ae.Code == amqp.NotFound || ae.Code == amqp.ResourceLocked)
}

// TryLock takes the lock as Lock does, once: a lock another holds is refused at once, with
// the broker's error (an *amqp.Error, 403; 404 if its last holder just deleted it), however
// long ctx lasts; ctx bounds the calls to a broker that is slow to answer.
func TryLock(ctx context.Context, conn *amqp.Connection, lockQueue string) (unlock func(), err error) {
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	err = amqpx.Do(ctx, ch, func() error {
		_, err := ch.QueueDeclare(lockQueue, false, true, false, false, amqp.Table{"x-expires": int32(time.Minute / time.Millisecond)})
		return err
	})
	if err == nil {
		err = amqpx.Do(ctx, ch, func() error {
			_, err := ch.Consume(lockQueue, "", false, true, false, false, nil)
			return err
		})
	}
	if err == nil {
		return func() { _ = ch.Close() }, nil
	}
	_ = ch.Close()
	return nil, fmt.Errorf("lock %s: %w", lockQueue, err)
}

// ReadMax bounds the messages read from a state queue at once. It holds one, but the
// commands a reader held come back when its connection is lost, maybe after a writer wrote
// a newer one.
const ReadMax = 8

// Read gets up to n messages of the state queue, without acking them (see Get), once
// none of its messages is out: got and not yet settled on some channel. The lock does not
// see to that. A holder that loses its connection (or whose get outlives its time limit, so
// that its channel is closed) lets go of the lock and of the messages it got separately:
// the exclusive consumer of the classic lock queue goes at once, while the quorum state
// queue returns the messages only once its log has recorded the holder's end. The next
// holder can take the lock in between (measured: see docs/decisions.md), and read an older
// command (returned already, or never taken) while the newest is still out. Read waits for
// them: a quorum queue counts each get not yet settled as a consumer of its own (RabbitMQ
// 3.10 and 4.0; nothing else consumes a state queue), and returns a lost holder's
// messages and drops its count in one step of its log. A holder cut off from the queue's
// leader by a partition is not counted (the queue suspects it down) and keeps what it got
// until it is back. The wait lasts as long as ctx: it ends with an error that says how
// many messages are out. A queue that does not exist is not waited for: the error is
// the broker's 404 (see amqpx.IsNotFound), and ch is closed.
func Read(ctx context.Context, ch *amqp.Channel, queue string, n int) ([]amqp.Delivery, error) {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval, b.MaxInterval, b.MaxElapsedTime = 2*time.Millisecond, 50*time.Millisecond, 0
	for {
		var q amqp.Queue
		err := amqpx.Do(ctx, ch, func() (err error) {
			q, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
			return err
		})
		if err != nil {
			return nil, err
		}
		if q.Consumers == 0 {
			return Get(ctx, ch, queue, n)
		}
		select {
		case <-time.After(b.NextBackOff()):
		case <-ctx.Done():
			return nil, fmt.Errorf("read %s: %d of its messages are out (got and not settled): %w", queue, q.Consumers, ctx.Err())
		}
	}
}

// Get gets up to n messages of queue, without acking them, each get bounded by ctx. It does
// not wait for messages that are out (see Read).
func Get(ctx context.Context, ch *amqp.Channel, queue string, n int) (ds []amqp.Delivery, err error) {
	for range n {
		var d amqp.Delivery
		ok := false
		err := amqpx.Do(ctx, ch, func() (err error) {
			d, ok, err = ch.Get(queue, false)
			return err
		})
		if err != nil || !ok {
			return ds, err
		}
		ds = append(ds, d)
	}
	return ds, nil
}

// Settle puts the newest state (body, if any) back into the state queue name as a
// new message, published on ch and confirmed, then removes the messages read (ds, got on
// ch) but the refused ones, which it requeues: the stale ones, and those with the newest's
// body once the copy is in, are acked. It does not requeue the newest: while a reader held
// a state a writer wrote the next one, and the reader requeued what it held, a get of the
// next reader could return the requeued command and then "empty", the newer one out of its
// sight (seen on RabbitMQ 3.10.8). If the broker refuses the copy (a nack), the newest is
// requeued instead.
func Settle(ctx context.Context, ch *amqp.Channel, name string, ds, stale []amqp.Delivery, body []byte) error {
	copied := body == nil
	if !copied {
		err := amqpx.Do(ctx, ch, func() error {
			return amqpx.PublishConfirmed(ctx, ch, "", name, false, amqp.Publishing{
				ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body,
			})
		})
		switch {
		case err == nil:
			copied = true
		case !errors.Is(err, amqpx.ErrNacked):
			return err
		}
	}
	for _, d := range ds {
		isStale := slices.ContainsFunc(stale, func(x amqp.Delivery) bool { return x.DeliveryTag == d.DeliveryTag })
		var err error
		switch {
		case isStale, copied && bytes.Equal(d.Body, body):
			err = d.Ack(false)
		default:
			err = d.Nack(false, true)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// OnChannel runs op on a channel of its own, closed afterwards: a refusal closes the
// channel it comes on, and no other operation's.
func OnChannel(conn *amqp.Connection, op func(ch *amqp.Channel) error) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	return op(ch)
}

// Exists reports whether the state queue queue exists, by a passive declare on a channel of
// its own, without the lock. A reader that finds none needs no lock: a state written after
// this answer is one the reader could not have read under the lock either. It is one round
// trip, where the lock takes three.
func Exists(ctx context.Context, conn *amqp.Connection, queue string) (bool, error) {
	err := OnChannel(conn, func(ch *amqp.Channel) error {
		return amqpx.Do(ctx, ch, func() error {
			_, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
			return err
		})
	})
	if amqpx.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}

// NewID returns a random id of 16 hex digits: a command's correlation id, a consumer
// process's id in its answers.
func NewID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
