package warren

import (
	"context"
	"sync/atomic"
)

// Delivery describes where a consumed message came from. warren's subscriber puts it in the
// context of every message it hands to a handler; middleware read it with DeliveryFrom.
type Delivery struct {
	// Queue the message was consumed from.
	Queue string
	// Exchange and RoutingKey it was published with. For a message that came through the
	// delay levels they are its destination exchange and its own routing key, not the
	// delivery exchange's.
	Exchange   string
	RoutingKey string
	// Redelivered is set when the broker delivered the message before (a consumer failed
	// or lost its connection without acking it).
	Redelivered bool
	// PublishID is the message's warren.PublishIDHeader: the same on every copy of one
	// publish. Empty for messages not published by warren.
	PublishID string
}

type deliveryKey struct{}

// WithDelivery returns ctx carrying d.
func WithDelivery(ctx context.Context, d Delivery) context.Context {
	return context.WithValue(ctx, deliveryKey{}, d)
}

// DeliveryFrom returns the Delivery in ctx, and whether there is one.
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
