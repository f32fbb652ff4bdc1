package middleware

import (
	"context"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
)

type attemptKey struct{}

// RetryCount reads the attempt number from the message's attempt bookkeeping (1 when absent
// or unreadable: see warren.DecodeAttemptRecord) and makes it available to the handler and
// the middleware inside it through Attempt.
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
	return warren.DecodeAttemptRecord(msg.Metadata).Attempt
}
