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
type deliveryKey struct{}

// WithDelivery returns ctx carrying d.
func WithDelivery(ctx context.Context, d Delivery) context.Context {
	return context.WithValue(ctx, deliveryKey{}, d)
}

// DeliveryFrom returns the Delivery in ctx, and whether there is one (warren.DeliveryFrom
// returns it to users).
func DeliveryFrom(ctx context.Context) (Delivery, bool) {
	d, ok := ctx.Value(deliveryKey{}).(Delivery)
	return d, ok
}

type deadLetterKey struct{}

// WithDeadLetter returns ctx in which DeadLetter records its request in requested. A
// subscriber that can reject a message into its queue's dead-letter path puts it in the
// context of every message it hands out, and rejects a nacked message whose flag is set.
func WithDeadLetter(ctx context.Context, requested *atomic.Bool) context.Context {
	return context.WithValue(ctx, deadLetterKey{}, requested)
}

// DeadLetter asks the subscriber that delivered the message whose context is ctx to reject
// it without requeueing when it is nacked, so that the broker dead-letters it (a warren work
// queue dead-letters into its poison queue, with x-death saying "rejected"). It is the last
// resort for a message that cannot even be published to the poison queue (too large for a
// frame once the poison headers are added). It reports whether the subscriber can do it; if
// not, the message is requeued as usual.
func DeadLetter(ctx context.Context) bool {
	requested, ok := ctx.Value(deadLetterKey{}).(*atomic.Bool)
	if ok {
		requested.Store(true)
	}
	return ok
}
