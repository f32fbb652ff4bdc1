package ops

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/topology"
)

// source is a queue that is browsed and replayed: a poison queue (work is its work queue) or
// the parking queue (work is "").
type source struct{ queue, work string }

func (o *Ops) poison(queue string) source { return source{topology.PoisonQueue(queue), queue} }
func (o *Ops) parking() source            { return source{o.cfg.Delay.ParkingQueue(), ""} }

// Browse says which messages Poisoned and Parked return.
type Browse struct {
	// Filter selects the messages.
	Filter Filter
	// Limit is the most messages returned (0: all that match).
	Limit int
	// Bodies: return the bodies too.
	Bodies bool
	// Scan is the most messages read, from the head of the queue (0: all). Reading fewer
	// than all is faster on a long queue, but a quorum queue on RabbitMQ 3.x puts the
	// messages read back at its tail (4.0 puts them back where they were, as a classic
	// queue does; docs/decisions.md): each such browse moves them behind the others.
	Scan int
}

// Poisoned returns the messages of the poison queue of queue that b selects, in queue order,
// and leaves the queue as it was (see the package doc).
func (o *Ops) Poisoned(ctx context.Context, queue string, b Browse) ([]Message, error) {
	return o.browse(ctx, o.poison(queue), b)
}

// Parked returns the messages of the parking queue of the delay levels that b selects, in
// queue order, and leaves the queue as it was (see the package doc).
func (o *Ops) Parked(ctx context.Context, b Browse) ([]Message, error) {
	return o.browse(ctx, o.parking(), b)
}

func (o *Ops) browse(ctx context.Context, src source, b Browse) ([]Message, error) {
	var out []Message
	err := o.scan(ctx, "ops: browse "+src.queue, src, b.Scan, func(ch *amqp.Channel, pos int, d amqp.Delivery) (bool, error) {
		if pos == 1 {
			out = out[:0] // a retried scan starts again
		}
		if m := fromDelivery(pos, d, src.work, b.Bodies); b.Filter.Match(m) && (b.Limit == 0 || len(out) < b.Limit) {
			out = append(out, m)
		}
		return false, nil
	})
	return out, err
}

// DeletePoisoned deletes the messages of the poison queue of queue that b selects (b.Bodies
// aside), and returns how many; the others stay, in their order. A lost connection is
// retried, and then the count may hold a message twice: the broker does not confirm an ack,
// so one it had not applied is deleted, and counted, again.
func (o *Ops) DeletePoisoned(ctx context.Context, queue string, b Browse) (int, error) {
	src := o.poison(queue)
	var n int
	err := o.scan(ctx, "ops: delete from "+src.queue, src, 0, func(ch *amqp.Channel, pos int, d amqp.Delivery) (bool, error) {
		if m := fromDelivery(pos, d, src.work, false); !b.Filter.Match(m) || b.Limit > 0 && n >= b.Limit {
			return false, nil
		}
		if err := ch.Ack(d.DeliveryTag, false); err != nil {
			return false, err
		}
		n++
		return true, nil
	})
	return n, err
}

// scan takes every message of src's queue (the first limit, if limit > 0), unacknowledged,
// and passes each to each in queue order (pos 1 first), which may acknowledge it (and then
// says so). At the end it hands back all the others at once. Past what the caller needs, the
// rest is taken all the same: a quorum queue on RabbitMQ 3.x puts a message it gets back at
// its tail (on 4.0 where it was), so only handing back all of them at once keeps the order.
func (o *Ops) scan(ctx context.Context, what string, src source, limit int, each func(ch *amqp.Channel, pos int, d amqp.Delivery) (acked bool, err error)) error {
	return o.call(ctx, what, func(ctx context.Context, ch *amqp.Channel) error {
		q, err := passive(ctx, ch, src.queue)
		if err != nil || q.Messages == 0 {
			return err
		}
		n := q.Messages
		if limit > 0 {
			n = min(n, limit)
		}
		tk, err := take(ctx, ch, src.queue, n)
		if err != nil {
			return err
		}
		defer tk.close()
		var last uint64 // the last message held
		acked := 0
		defer func() {
			for _, d := range tk.stop(ctx) { // delivered meanwhile: held too
				last = d.DeliveryTag
			}
			if last > 0 && ch.Nack(last, true, true) == nil {
				settle(ctx, ch, src.queue, q.Messages-acked, o.cfg.Timeout)
			}
		}()
		for pos := 1; pos <= n; pos++ {
			d, ok, err := tk.next(ctx)
			if err != nil || !ok {
				return err
			}
			if ok, err = each(ch, pos, d); err != nil {
				return err
			}
			if ok {
				acked++
			} else {
				last = d.DeliveryTag
			}
		}
		return nil
	})
}
