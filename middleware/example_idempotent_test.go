package middleware_test

import (
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren/middleware"
)

// A business operation done once per order id, however often its message arrives: the key is
// the user's own, and Idempotent sits around the handler (inside Backoff), so that only a
// success counts. With processes that share the work, the store is redisstore's.
func ExampleIdempotent() {
	store, err := middleware.NewMemoryStore(0)
	if err != nil {
		panic(err)
	}
	once, err := middleware.NewIdempotent(middleware.IdempotentConfig{
		Store: store,
		Key:   func(msg *message.Message) string { return "charge " + msg.Metadata.Get("order_id") },
	}, nil)
	if err != nil {
		panic(err)
	}
	charge := once.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		fmt.Println("charging order", msg.Metadata.Get("order_id"))
		return nil, nil
	})

	for _, order := range []string{"42", "42", "43"} {
		msg := message.NewMessage(order, nil)
		msg.Metadata.Set("order_id", order)
		if _, err := charge(msg); err != nil {
			panic(err)
		}
	}
	// Output:
	// charging order 42
	// charging order 43
}
