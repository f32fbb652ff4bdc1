package ops

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/kill"
)

// ErrNoQueue is wrapped by the errors about a queue that does not exist. It is
// kill.ErrNoQueue.
var ErrNoQueue = kill.ErrNoQueue

// Depth returns the number of messages ready in the poison queue of queue, or in the parking
// queue of the delay levels when queue is "".
func (o *Ops) Depth(ctx context.Context, queue string) (int, error) {
	src := o.parking()
	if queue != "" {
		src = o.poison(queue)
	}
	var n int
	err := o.call(ctx, "ops: depth of "+src.queue, func(ctx context.Context, ch *amqp.Channel) error {
		q, err := passive(ctx, ch, src.queue)
		n = q.Messages
		return err
	})
	return n, err
}

// PurgePoisoned deletes every message of the poison queue of queue, and returns how many.
func (o *Ops) PurgePoisoned(ctx context.Context, queue string) (int, error) {
	var n int
	src := o.poison(queue)
	err := o.call(ctx, "ops: purge "+src.queue, func(ctx context.Context, ch *amqp.Channel) error {
		if _, err := passive(ctx, ch, src.queue); err != nil {
			return err
		}
		return amqpx.Do(ctx, ch, func() (err error) {
			n, err = ch.QueuePurge(src.queue, false)
			return err
		})
	})
	return n, err
}

// passive returns queue as the broker has it, or an error wrapping ErrNoQueue (which closes
// ch).
func passive(ctx context.Context, ch *amqp.Channel, queue string) (amqp.Queue, error) {
	var q amqp.Queue
	err := amqpx.Do(ctx, ch, func() (err error) {
		q, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err
	})
	if amqpx.IsNotFound(err) {
		return q, amqpx.GiveUp(fmt.Errorf("%w: %s", ErrNoQueue, queue))
	}
	return q, err
}

// settleMax bounds the wait of cameBack, which expects no message back unless a lost
// connection's come back.
const settleMax = 2 * time.Second

// settle waits until queue counts at least n messages again, for up to limit: the broker
// applies a hand-back asynchronously, and until it has, a quorum queue counts fewer messages
// (docs/decisions.md: Reading a queue: consumers, not basic.get), so that a browse or
// replay that followed at once would see fewer messages than there are. Its consumer count
// cannot tell whether another consumer took some meanwhile (a cancelled consumer is counted
// out a moment later): then it waits for all of limit, and gives up silently.
func settle(ctx context.Context, ch *amqp.Channel, queue string, n int, limit time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	b := backoff.WithContext(&backoff.ExponentialBackOff{InitialInterval: time.Millisecond, RandomizationFactor: 0.5,
		Multiplier: 2, MaxInterval: 100 * time.Millisecond, Stop: backoff.Stop, Clock: backoff.SystemClock}, ctx)
	_ = backoff.Retry(func() error {
		q, err := passive(ctx, ch, queue)
		if err != nil {
			return backoff.Permanent(err)
		}
		if q.Messages < n {
			return errors.New("not yet")
		}
		return nil
	}, b)
}
