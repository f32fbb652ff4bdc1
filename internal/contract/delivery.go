// Package contract holds what warren's packages share about a message and its delivery
// beyond the root package's API: the transport headers the DLX publisher sets and the
// subscriber drops, how a header value reads as metadata, and the delivery's context (where
// it came from, and a handler's request to dead-letter it). It imports no warren package:
// the root package builds on it.
package contract

import (
	"context"
	"sync/atomic"
)

// Delivery is warren.Delivery (the root package converts one to the other: the fields are
// the same): where a consumed message came from.
type Delivery struct {
	Queue       string
	Exchange    string
	RoutingKey  string
	Redelivered bool
	PublishID   string
}

// Handling is what a subscriber puts in the context of a message it hands out, as one value:
// where the message came from, a handler's request to dead-letter it (DeadLetter), and, for a
// receiver that settles the messages it handles (see Settle), what settles it.
type Handling struct {
	Delivery Delivery
	// DeadLetters is set when the subscriber rejects the message into its queue's dead-letter
	// path if it is nacked after DeadLetter was called.
	DeadLetters bool
	// Settler settles the message when its receiver calls Settle; nil when the subscriber
	// watches the message's ack and nack itself.
	Settler Settler
	// Stopping is closed when the consumer that delivered the message stops or loses its
	// channel: a delivery not settled by then goes back to its queue, whatever its handler
	// does. Nil when the subscriber does not say.
	Stopping <-chan struct{}
	// Holder holds the message's order key, failed for good, in its lane of a queue ordered
	// by key: the key's later messages wait until an operator releases or skips them (see
	// package held). Nil where a poisoned message holds nothing.
	Holder     Holder
	deadLetter atomic.Bool
}

// Holder holds the order key of a message that failed for good with cause (see
// Handling.Holder).
type Holder interface {
	Hold(cause error) error
}

// Settler settles a message handed out: acked, or nacked (requeued, or rejected when
// DeadLetter was called). A Settler settles once; later calls do nothing.
type Settler interface {
	Settle(acked bool)
}

type handlingKey struct{}

// WithHandling returns ctx carrying h.
func WithHandling(ctx context.Context, h *Handling) context.Context {
	return context.WithValue(ctx, handlingKey{}, h)
}

// HandlingFrom returns the Handling in ctx, or nil.
func HandlingFrom(ctx context.Context) *Handling {
	h, _ := ctx.Value(handlingKey{}).(*Handling)
	return h
}

// WithDelivery returns ctx carrying d, and nothing that can dead-letter or settle it.
func WithDelivery(ctx context.Context, d Delivery) context.Context {
	return WithHandling(ctx, &Handling{Delivery: d})
}

// DeliveryFrom returns the Delivery in ctx, and whether there is one (warren.DeliveryFrom
// returns it to users).
func DeliveryFrom(ctx context.Context) (Delivery, bool) {
	if h := HandlingFrom(ctx); h != nil {
		return h.Delivery, true
	}
	return Delivery{}, false
}

// DeadLetter asks the subscriber that delivered the message whose context is ctx to reject
// it without requeueing when it is nacked, so that the broker dead-letters it (a warren work
// queue dead-letters into its poison queue, with x-death saying "rejected"). It is the last
// resort for a message that cannot even be published to the poison queue (too large for a
// frame once the poison headers are added). It reports whether the subscriber can do it; if
// not, the message is requeued as usual.
func DeadLetter(ctx context.Context) bool {
	h := HandlingFrom(ctx)
	if h == nil || !h.DeadLetters {
		return false
	}
	h.deadLetter.Store(true)
	return true
}

// StoppingFrom returns the Handling.Stopping of the message whose context is ctx, nil when
// there is none.
func StoppingFrom(ctx context.Context) <-chan struct{} {
	if h := HandlingFrom(ctx); h != nil {
		return h.Stopping
	}
	return nil
}

// HoldKey holds the order key of the message whose context is ctx, which failed for good
// with cause, when its subscriber holds keys (see Handling.Holder); it reports whether it did.
// The message is then to be poisoned as usual.
func HoldKey(ctx context.Context, cause error) (bool, error) {
	h := HandlingFrom(ctx)
	if h == nil || h.Holder == nil {
		return false, nil
	}
	return true, h.Holder.Hold(cause)
}

// DeadLetterRequested reports whether DeadLetter was called in the message's context.
func (h *Handling) DeadLetterRequested() bool { return h.deadLetter.Load() }

// Settle has the message whose context is ctx settled, acked or nacked, by its Settler, when
// it has one: a receiver that handles messages calls it once it is done with one (a router's
// handler, once the chain returned). It reports whether there was a Settler.
func Settle(ctx context.Context, acked bool) bool {
	h := HandlingFrom(ctx)
	if h == nil || h.Settler == nil {
		return false
	}
	h.Settler.Settle(acked)
	return true
}
