package warren

import (
	"context"

	"github.com/warrenmq/warren/internal/contract"
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
	// PublishID is the message's publish id (its header warren-dlx-id): the same on every copy of one
	// publish. Empty for messages not published by warren.
	PublishID string
}

// DeliveryFrom returns the Delivery in ctx, and whether there is one.
func DeliveryFrom(ctx context.Context) (Delivery, bool) {
	d, ok := contract.DeliveryFrom(ctx)
	return Delivery(d), ok
}
