package amqpx

import (
	"context"
	"errors"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrNacked is wrapped by the error of a publishing the broker nacked (dlx.ErrNacked).
var ErrNacked = errors.New("the broker nacked the message")

// ReturnedError is the error of a mandatory publishing the broker could not route
// (dlx.ReturnedError).
type ReturnedError struct {
	Exchange, RoutingKey string
	ReplyCode            uint16
	ReplyText            string
}

// Error says which exchange and routing key the broker could not route, and why.
func (e *ReturnedError) Error() string {
	return fmt.Sprintf("the broker returned the message: %d %s (exchange %q, routing key %q)",
		e.ReplyCode, e.ReplyText, e.Exchange, e.RoutingKey)
}

// Confirmer publishes on one channel in confirm mode, with any number of publishings in
// flight, and resolves each to acked, nacked (ErrNacked) or returned (*ReturnedError). dlx's
// publisher and rpc's client (whose requests go out on the channel that consumes the
// replies) publish through it.
//
// Ordering is what makes returns exact: RabbitMQ sends basic.return before the basic.ack of
// the same message, and amqp091 hands both over, in that order, from its one reader
// goroutine. The channels are buffered (the reader does not wait for run at every message),
// so run takes every return already handed over before it handles a confirmation: a
// publishing's return is always recorded before its confirmation is handled.
type Confirmer struct {
	ch *amqp.Channel

	sendMu sync.Mutex // serialises publishing, so that seq follows the broker's delivery tags
	seq    uint64

	mu      sync.Mutex
	pending map[uint64]*Inflight
	// unreturned holds, per (exchange, routing key, message id, correlation id), the
	// mandatory publishings that are neither confirmed nor returned yet: the oldest, which
	// links to the next (Inflight.next). A return carries no delivery tag; it belongs to the
	// oldest of them.
	unreturned map[returnKey]*Inflight
	err        error         // set when the channel is closed
	done       chan struct{} // closed once the channel is closed and everything in flight failed
	retired    bool          // set by Retire: no more publishings; closed once none is pending
	closing    sync.Once     // closes the channel of a retired Confirmer
}

type returnKey struct{ exchange, key, messageID, correlationID string }

// Inflight is a publishing awaiting the broker's confirmation.
type Inflight struct {
	key      returnKey
	next     *Inflight // the next unreturned publishing of the same key
	returned *amqp.Return
	err      error         // the result, set before done is closed
	done     chan struct{} // closed once the result is set (a channel without pointers: one allocation)
}

// settle sets f's result; it is called once.
func (f *Inflight) settle(err error) {
	f.err = err
	close(f.done)
}

// NewConfirmer puts ch in confirm mode and tracks the publishings on it until it closes.
func NewConfirmer(ch *amqp.Channel) (*Confirmer, error) {
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	c := newConfirmer(ch)
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, 1024))
	returns := ch.NotifyReturn(make(chan amqp.Return, 64))
	closes := ch.NotifyClose(make(chan *amqp.Error, 1))
	go c.run(confirms, returns, closes)
	return c, nil
}

func newConfirmer(ch *amqp.Channel) *Confirmer {
	return &Confirmer{ch: ch, pending: map[uint64]*Inflight{}, unreturned: map[returnKey]*Inflight{}, done: make(chan struct{})}
}

func (c *Confirmer) run(confirms <-chan amqp.Confirmation, returns <-chan amqp.Return, closes <-chan *amqp.Error) {
	defer close(c.done)
	record := func(r amqp.Return) {
		c.mu.Lock()
		k := returnKey{r.Exchange, r.RoutingKey, r.MessageId, r.CorrelationId}
		if f := c.unreturned[k]; f != nil {
			f.returned = &r
			c.dropUnreturned(f)
		}
		c.mu.Unlock()
	}
	for {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			record(r)
		case conf, ok := <-confirms:
			// The returns handed over before this confirmation come first.
		drain:
			for returns != nil {
				select {
				case r, ok := <-returns:
					if !ok {
						returns = nil
						break drain
					}
					record(r)
				default:
					break drain
				}
			}
			if !ok {
				err := errors.New("channel closed")
				if e, ok := <-closes; ok && e != nil {
					err = fmt.Errorf("channel closed: %w", e)
				}
				c.closeAll(err)
				return
			}
			c.mu.Lock()
			f := c.pending[conf.DeliveryTag]
			delete(c.pending, conf.DeliveryTag)
			if f != nil {
				c.dropUnreturned(f)
			}
			settled := c.retired && len(c.pending) == 0
			c.mu.Unlock()
			if settled {
				c.close()
			}
			if f == nil {
				continue
			}
			switch {
			case !conf.Ack:
				f.settle(ErrNacked)
			case f.returned != nil:
				r := f.returned
				f.settle(&ReturnedError{r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText})
			default:
				f.settle(nil)
			}
		}
	}
}

// dropUnreturned removes f from the unreturned list of its key. c.mu must be held.
func (c *Confirmer) dropUnreturned(f *Inflight) {
	head := c.unreturned[f.key]
	if head == f {
		if f.next == nil {
			delete(c.unreturned, f.key)
		} else {
			c.unreturned[f.key] = f.next
		}
		f.next = nil
		return
	}
	for g := head; g != nil; g = g.next {
		if g.next == f {
			g.next, f.next = f.next, nil
			return
		}
	}
}

// addUnreturned appends f to the unreturned list of its key. c.mu must be held.
func (c *Confirmer) addUnreturned(f *Inflight) {
	g := c.unreturned[f.key]
	if g == nil {
		c.unreturned[f.key] = f
		return
	}
	for g.next != nil {
		g = g.next
	}
	g.next = f
}

func (c *Confirmer) closeAll(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = err
	for tag, f := range c.pending {
		f.settle(err)
		delete(c.pending, tag)
	}
	c.unreturned = map[returnKey]*Inflight{}
}

// ErrRetired is the error of a Publish on a Confirmer that Retire ended: publish on a new
// channel.
var ErrRetired = errors.New("the channel was retired after a nack")

// Retire ends the use of c's channel: Publish fails with ErrRetired from now on, and the
// channel is closed once every publishing in flight on it is settled (none is cut short).
// The rule behind it: RabbitMQ 3.10.8 nacks every publish to a quorum queue on a channel
// that first published to it while it had no leader, until the old leader's node is back;
// a channel opened later is not affected (docs/decisions.md, docs/clusters.md).
func (c *Confirmer) Retire() {
	c.mu.Lock()
	idle := !c.retired && len(c.pending) == 0
	c.retired = true
	c.mu.Unlock()
	if idle {
		c.close()
	}
}

// close closes the channel once, without waiting for the broker's close-ok: the reader
// goroutine of amqp091 that delivers it may be handing a confirmation to run.
func (c *Confirmer) close() {
	c.closing.Do(func() { go func() { _ = c.ch.Close() }() })
}

// Closed reports the error the channel closed with, or nil while it is open.
func (c *Confirmer) Closed() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Done is closed once the channel is closed and every publishing in flight on it failed:
// Closed then says why.
func (c *Confirmer) Done() <-chan struct{} { return c.done }

// Publish sends p and returns the publishing in flight; its result is nil once the broker
// has confirmed it, or the reason it did not.
func (c *Confirmer) Publish(ctx context.Context, exchange, key string, mandatory bool, p amqp.Publishing) (*Inflight, error) {
	f := &Inflight{key: returnKey{exchange, key, p.MessageId, p.CorrelationId}, done: make(chan struct{})}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()

	c.mu.Lock()
	if c.err != nil || c.retired {
		err := c.err
		if c.retired { // the channel may have closed since: retiring closes it
			err = ErrRetired
		}
		c.mu.Unlock()
		return nil, err
	}
	c.seq++
	tag := c.seq
	c.pending[tag] = f
	if mandatory {
		c.addUnreturned(f)
	}
	c.mu.Unlock()

	// The confirmation can only arrive after the frame is sent, and f is registered before.
	if err := c.ch.PublishWithContext(ctx, exchange, key, mandatory, false, p); err != nil {
		c.mu.Lock()
		if _, ok := c.pending[tag]; ok { // not already failed by closeAll
			delete(c.pending, tag)
			c.dropUnreturned(f)
			c.seq-- // amqp091 did not count it either
		}
		settled := c.retired && len(c.pending) == 0
		c.mu.Unlock()
		if settled {
			c.close()
		}
		return nil, err
	}
	return f, nil
}

// PublishConfirmed puts ch in confirm mode, publishes p on it and waits for the broker: nil
// once it is acked and not returned, ErrNacked, a *ReturnedError (mandatory), the channel's
// close, or ctx's error. It is the one-shot form of a Confirmer, for a channel that publishes
// once or a few times; the Confirmer it makes tracks ch until ch is closed.
func PublishConfirmed(ctx context.Context, ch *amqp.Channel, exchange, key string, mandatory bool, p amqp.Publishing) error {
	c, err := NewConfirmer(ch)
	if err != nil {
		return err
	}
	f, err := c.Publish(ctx, exchange, key, mandatory, p)
	if err != nil {
		return err
	}
	return f.Wait(ctx)
}

// Wait returns the publishing's result, or the context's error if it ends first. A return
// comes before the confirmation: a returned publishing's result is a *ReturnedError.
func (f *Inflight) Wait(ctx context.Context) error {
	select {
	case <-f.done:
		return f.err
	case <-ctx.Done():
		return fmt.Errorf("waiting for the broker's confirmation: %w", ctx.Err())
	}
}
