package warren

import "context"

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
