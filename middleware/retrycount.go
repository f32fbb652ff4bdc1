package middleware

import (
	"context"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Metadata that warren's middleware read and write. They are ordinary metadata: they travel
// as headers and survive the delay levels and every retry.
const (
	// AttemptKey counts the attempts to process a message: absent or "1" on the first,
	// set by Backoff on every retry. warren never counts with x-death, which RabbitMQ no
	// longer maintains for republished messages (3.13/4.0).
	AttemptKey = "warren_attempt"
	// FirstFailureKey is when the first attempt failed (RFC 3339).
	FirstFailureKey = "warren_first_failure"
	// OriginalExchangeKey and OriginalRoutingKeyKey are where the message was first
	// published to; retries go straight to the queue, so they would be lost otherwise.
	OriginalExchangeKey   = "warren_original_exchange"
	OriginalRoutingKeyKey = "warren_original_routing_key"
)

// IsBookkeeping reports whether a metadata key is one of warren's bookkeeping: AttemptKey,
// FirstFailureKey, the Original* keys and the Poison* keys. warren's subscriber drops them
// from messages that come from outside (see router.Subscriber): they are set by warren only.
func IsBookkeeping(key string) bool {
	switch key {
	case AttemptKey, FirstFailureKey, OriginalExchangeKey, OriginalRoutingKeyKey:
		return true
	}
	return strings.HasPrefix(key, PoisonHeaderPrefix)
}

type attemptKey struct{}

// RetryCount reads the attempt number from the message's AttemptKey header (1 when absent
// or unreadable) and makes it available to the handler and the middleware inside it through
// Attempt.
func RetryCount(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		msg.SetContext(context.WithValue(msg.Context(), attemptKey{}, readAttempt(msg)))
		return h(msg)
	}
}

// Attempt returns the attempt number of msg: 1 for the first delivery, 2 for the first
// retry, and so on. It works with or without RetryCount in the chain.
func Attempt(msg *message.Message) int {
	if n := AttemptFromContext(msg.Context()); n > 0 {
		return n
	}
	return readAttempt(msg)
}

// AttemptFromContext returns the attempt number RetryCount put in the context of the message
// being processed (for handlers that get the context, not the message), or 0.
func AttemptFromContext(ctx context.Context) int {
	n, _ := ctx.Value(attemptKey{}).(int)
	return n
}

func readAttempt(msg *message.Message) int {
	n, err := strconv.Atoi(msg.Metadata.Get(AttemptKey))
	if err != nil || n < 1 {
		return 1
	}
	return n
}
