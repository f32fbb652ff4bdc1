package ops

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
)

// taker takes the messages of a queue through consumers on one channel, in queue order.
//
// The broker streams the messages to consumers rather than giving them one basic.get (a
// round trip) at a time, which is far slower on a long queue (docs/decisions.md: Reading a
// queue: consumers, not basic.get). A consumer holds at most 65,535 unacknowledged messages
// (its prefetch count, 16 bits; a quorum queue gives one without a limit 2,000), so there is
// one per 65,535 messages. They share the channel, whose delivery tags number the messages in
// the order the queue gave them.
type taker struct {
	ch      *amqp.Channel
	queue   string
	merged  chan amqp.Delivery // from every consumer; closed once all have ended
	quit    chan struct{}      // closed by close: the consumers' forwarders stop
	tags    []string
	pending map[uint64]amqp.Delivery // delivered, not yet returned by next
	next1   uint64                   // the tag next returns
	tick    *time.Ticker
	last    time.Time // when the last message came; zero before the first
	closed  bool
}

// take starts taking n messages of queue on ch, a channel that has taken none before (its
// first delivery tag is 1). Close the taker when done.
func take(ctx context.Context, ch *amqp.Channel, queue string, n int) (*taker, error) {
	t := &taker{ch: ch, queue: queue, merged: make(chan amqp.Delivery, 256), quit: make(chan struct{}),
		pending: map[uint64]amqp.Delivery{}, next1: 1, tick: time.NewTicker(250 * time.Millisecond)}
	var wg sync.WaitGroup
	err := amqpx.Do(ctx, ch, func() error {
		for i := range (n + maxPrefetch - 1) / maxPrefetch {
			if err := ch.Qos(min(n, maxPrefetch), 0, false); err != nil {
				return err
			}
			tag := "warren-ops-take-" + strconv.Itoa(i)
			ds, err := ch.Consume(queue, tag, false, false, false, false, nil)
			if err != nil {
				return err
			}
			t.tags = append(t.tags, tag)
			wg.Go(func() {
				for d := range ds {
					select {
					case t.merged <- d:
					case <-t.quit:
						return
					}
				}
			})
		}
		return nil
	})
	go func() {
		wg.Wait()
		close(t.merged)
	}()
	if err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

// next returns the next message of the queue; ok is false when the queue has none left to
// give: once messages have come, none came for takeQuiet while next waited and the queue
// counts none ready (another reader took them). The broker counts the messages it is sending
// as not ready, so a shorter pause can end a take early on a busy machine (docs/decisions.md:
// Reading a queue: consumers, not basic.get); the time the caller spent between calls does
// not count (a replay's commit can take longer than takeQuiet there, while the messages wait
// in the channel); before the first one comes, the broker may be slow to start, and next
// waits for as long as ctx lets it.
func (t *taker) next(ctx context.Context) (d amqp.Delivery, ok bool, err error) {
	called := time.Now()
	for {
		if d, ok := t.pending[t.next1]; ok {
			delete(t.pending, t.next1)
			t.next1++
			return d, true, nil
		}
		select {
		case d, open := <-t.merged:
			if !open {
				return d, false, fmt.Errorf("the broker cancelled the consumers of %s (deleted?)", t.queue)
			}
			t.pending[d.DeliveryTag], t.last = d, time.Now()
		case <-t.tick.C:
			if t.last.IsZero() || time.Since(t.last) < takeQuiet || time.Since(called) < takeQuiet {
				continue
			}
			if q, err := passive(ctx, t.ch, t.queue); err != nil || q.Messages == 0 {
				return d, false, err
			}
		case <-ctx.Done():
			return d, false, context.Cause(ctx)
		}
	}
}

// takeQuiet is how long a take waits for the next message before it asks whether any is
// left (a variable for a test to shorten).
var takeQuiet = 5 * time.Second

// stop cancels the consumers and returns, in order, the messages they were given that next
// has not returned: they are held like the others, for one nack to hand everything back in
// order. If a cancel fails (ctx is done, the channel is closed), it returns those it has.
func (t *taker) stop(ctx context.Context) []amqp.Delivery {
	cancelled := true
	for _, tag := range t.tags {
		if amqpx.Do(ctx, t.ch, func() error { return t.ch.Cancel(tag, false) }) != nil {
			cancelled = false
			break
		}
	}
	if cancelled {
		for d := range t.merged { // closed once every consumer is cancelled
			t.pending[d.DeliveryTag] = d
		}
	}
	t.close()
	left := slices.Collect(maps.Values(t.pending))
	slices.SortFunc(left, func(a, b amqp.Delivery) int { return cmp.Compare(a.DeliveryTag, b.DeliveryTag) })
	t.pending = map[uint64]amqp.Delivery{}
	return left
}

// close stops the forwarders (the channel's closing ends the consumers); it may be called
// more than once.
func (t *taker) close() {
	if !t.closed {
		t.closed = true
		close(t.quit)
		t.tick.Stop()
	}
}

// maxPrefetch is the largest prefetch count AMQP 0-9-1 can give a consumer.
const maxPrefetch = 65535
