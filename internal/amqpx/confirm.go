package amqpx

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

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
// flight, and resolves each to acked, nacked (ErrNacked), returned (*ReturnedError) or failed
// with the channel's close. dlx's publisher and rpc's client (whose requests go out on the
// channel that consumes the replies) publish through it.
//
// amqp091 tracks the confirmation of each publishing itself (a DeferredConfirmation, closed
// by its one reader goroutine); the Confirmer adds returns, the close's reason and Retire,
// and costs a publishing nothing more on the way: no goroutine hop, no map.
//
// Ordering is what makes returns exact: RabbitMQ sends basic.return before the basic.ack of
// the same message, and amqp091's reader hands the return over (NotifyReturn, buffered)
// before it marks the confirmation done. Once a mandatory publishing's confirmation is done,
// its return, if any, has been handed over: the waiter takes every return handed over so far
// and claims the oldest one of its exchange, routing key, message id and correlation id (a
// return carries no delivery tag). Likewise amqp091 marks the channel closed before it nacks
// the publishings in flight with it: a publishing that is not acked on a closed channel
// failed with the close (whose reason Closed gives), else the broker nacked it (also when
// Retire closed the channel, which it does once everything in flight is settled).
type Confirmer struct {
	send     func(exchange, key string, mandatory bool, p amqp.Publishing) (confirmation, error)
	isClosed func() bool  // the channel is marked closed (before amqp091 nacks what is in flight)
	closeCh  func() error // closes the channel
	returns  <-chan amqp.Return

	err  error         // why the channel closed, set before done is closed
	done chan struct{} // closed once the channel is closed and everything in flight failed

	sendMu   sync.Mutex     // serialises publishing, with Retire
	retired  bool           // set by Retire: no more publishings; closed once none is in flight
	inflight []confirmation // the publishings that may be in flight, for Retire
	closing  sync.Once      // closes the channel of a retired Confirmer
	// settledOpen is set when Retire closes the channel: everything in flight was settled
	// while it was open, so what was not acked was nacked by the broker.
	settledOpen atomic.Bool

	retMu     sync.Mutex
	unclaimed []amqp.Return // returns handed over that no publishing claimed yet
	orphans   []Inflight    // mandatory publishings whose waiter gave up: their returns are dropped
}

// confirmation is what a Confirmer needs of amqp091's *amqp.DeferredConfirmation.
type confirmation interface {
	Done() <-chan struct{}
	Acked() bool
}

type returnKey struct{ exchange, key, messageID, correlationID string }

// Inflight is a publishing awaiting the broker's confirmation.
type Inflight struct {
	c         *Confirmer
	dc        confirmation
	key       returnKey // of a mandatory publishing, which a return may be for
	mandatory bool
}

// returnsBuffer is how many returns amqp091's reader hands over before a publishing's waiter
// (or the next Publish) takes them; a full buffer holds the reader back.
const returnsBuffer = 64

// NewConfirmer puts ch in confirm mode and tracks the publishings on it until it closes.
func NewConfirmer(ch *amqp.Channel) (*Confirmer, error) {
	if err := ch.Confirm(false); err != nil {
		return nil, fmt.Errorf("confirm mode: %w", err)
	}
	c := &Confirmer{
		send: func(exchange, key string, mandatory bool, p amqp.Publishing) (confirmation, error) {
			dc, err := ch.PublishWithDeferredConfirm(exchange, key, mandatory, false, p)
			if err != nil {
				return nil, err
			}
			return dc, nil
		},
		isClosed: ch.IsClosed,
		closeCh:  ch.Close,
		returns:  ch.NotifyReturn(make(chan amqp.Return, returnsBuffer)),
		done:     make(chan struct{}),
	}
	// The transition to closed comes once amqp091 has nacked everything in flight.
	states := make(chan *amqp.StateChanged, 4)
	ch.NotifyStateChange(states)
	go c.watch(states)
	return c, nil
}

// watch reads the channel's state changes until the last (closed), then records the close's
// reason and closes done.
func (c *Confirmer) watch(states <-chan *amqp.StateChanged) {
	err := errors.New("channel closed")
	for s := range states {
		var e *amqp.Error
		if s.To == amqp.StateClosed && errors.As(s.Err, &e) {
			err = fmt.Errorf("channel closed: %w", e)
		}
	}
	c.err = err
	close(c.done)
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
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	if c.retired {
		return
	}
	c.retired = true
	inflight := c.inflight
	c.inflight = nil
	// Closing waits for no answer: amqp091's reader, which delivers the close-ok, may be
	// handing a return over to a waiter that waits for the channel.
	c.closing.Do(func() {
		go func() {
			for _, dc := range inflight {
				<-dc.Done() // the close nacks whatever is left: this ends
			}
			if !c.isClosed() {
				c.settledOpen.Store(true)
				_ = c.closeCh()
			}
		}()
	})
}

// Closed reports the error the channel closed with, or nil while it is open.
func (c *Confirmer) Closed() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// Done is closed once the channel is closed and every publishing in flight on it failed:
// Closed then says why.
func (c *Confirmer) Done() <-chan struct{} { return c.done }

// Publish sends p and returns the publishing in flight; its result is nil once the broker
// has confirmed it, or the reason it did not. ctx is only checked first: amqp091's write
// of the frames cannot be cut short.
func (c *Confirmer) Publish(ctx context.Context, exchange, key string, mandatory bool, p amqp.Publishing) (Inflight, error) {
	if err := ctx.Err(); err != nil {
		return Inflight{}, err
	}
	if len(c.returns) > 0 { // take them before the buffer fills, whether or not a waiter does
		c.retMu.Lock()
		c.takeReturns()
		c.retMu.Unlock()
	}
	c.sendMu.Lock()
	if c.retired {
		c.sendMu.Unlock()
		return Inflight{}, ErrRetired
	}
	dc, err := c.send(exchange, key, mandatory, p)
	if err == nil {
		c.track(dc)
	}
	c.sendMu.Unlock()
	if err != nil {
		if c.isClosed() {
			return Inflight{}, c.closeErr(ctx)
		}
		return Inflight{}, err
	}
	f := Inflight{c: c, dc: dc, mandatory: mandatory}
	if mandatory {
		f.key = returnKey{exchange, key, p.MessageId, p.CorrelationId}
	}
	return f, nil
}

// track adds dc to the publishings that may be in flight, dropping those settled when the
// list is full. c.sendMu must be held.
func (c *Confirmer) track(dc confirmation) {
	if len(c.inflight) == cap(c.inflight) {
		c.inflight = slices.DeleteFunc(c.inflight, func(dc confirmation) bool {
			select {
			case <-dc.Done():
				return true
			default:
				return false
			}
		})
		if len(c.inflight) > cap(c.inflight)/2 {
			c.inflight = slices.Grow(c.inflight, max(cap(c.inflight), 64))
		}
	}
	c.inflight = append(c.inflight, dc)
}

// closeErr waits until the channel, which is marked closed, has failed everything in flight,
// and returns why it closed.
func (c *Confirmer) closeErr(ctx context.Context) error {
	select {
	case <-c.done:
		return c.err
	case <-ctx.Done():
		return fmt.Errorf("channel closing: %w", ctx.Err())
	}
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
func (f Inflight) Wait(ctx context.Context) error {
	select {
	case <-f.dc.Done():
	case <-ctx.Done():
		if f.mandatory {
			f.c.orphan(f)
		}
		return fmt.Errorf("waiting for the broker's confirmation: %w", ctx.Err())
	}
	acked := f.dc.Acked()
	var ret *ReturnedError
	if f.mandatory {
		ret = f.c.claim(f.key)
	}
	switch {
	case !acked && f.c.isClosed() && !f.c.settledOpen.Load():
		return f.c.closeErr(ctx)
	case !acked:
		return ErrNacked
	case ret != nil:
		return ret
	}
	return nil
}

// claim takes the returns handed over and removes the oldest one of k, which it returns as
// an error; nil if there is none.
func (c *Confirmer) claim(k returnKey) *ReturnedError {
	c.retMu.Lock()
	defer c.retMu.Unlock()
	c.takeReturns()
	return c.claimLocked(k)
}

func (c *Confirmer) claimLocked(k returnKey) *ReturnedError {
	for i := range c.unclaimed {
		r := &c.unclaimed[i]
		if r.Exchange == k.exchange && r.RoutingKey == k.key && r.MessageId == k.messageID && r.CorrelationId == k.correlationID {
			err := &ReturnedError{r.Exchange, r.RoutingKey, r.ReplyCode, r.ReplyText}
			c.unclaimed = slices.Delete(c.unclaimed, i, i+1)
			return err
		}
	}
	return nil
}

// takeReturns moves the returns handed over to c.unclaimed, and drops those of the orphans
// that are confirmed. c.retMu must be held: the only receiver, it never blocks.
func (c *Confirmer) takeReturns() {
	for len(c.returns) > 0 {
		r, ok := <-c.returns
		if !ok {
			break
		}
		c.unclaimed = append(c.unclaimed, r)
	}
	if len(c.orphans) > 0 {
		c.orphans = slices.DeleteFunc(c.orphans, func(f Inflight) bool {
			select {
			case <-f.dc.Done():
				_ = c.claimLocked(f.key) // dropped: nobody waits for it
				return true
			default:
				return false
			}
		})
	}
}

// orphan records f, whose waiter gave up, so that its return, if any, is dropped once it is
// confirmed rather than claimed by a later publishing of the same key.
func (c *Confirmer) orphan(f Inflight) {
	c.retMu.Lock()
	c.orphans = append(c.orphans, f)
	c.retMu.Unlock()
}
