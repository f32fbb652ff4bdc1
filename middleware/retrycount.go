package middleware

import (
	"context"
	"strconv"
	"strings"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
)

// Metadata that warren's middleware read and write. They are ordinary metadata: they travel
// as headers and survive the delay levels and every retry of a message in its queue, but no
// hop to another queue (see IsBookkeeping).
const (
	// AttemptKey counts the attempts to process a message in its queue: absent or "1" on
	// the first, set by Backoff on every retry. warren never counts with x-death, which
	// RabbitMQ no longer maintains for republished messages (3.13/4.0).
	AttemptKey = "warren_attempt"
	// FirstFailureKey is when the first attempt failed (RFC 3339).
	FirstFailureKey = "warren_first_failure"
	// OriginalExchangeKey and OriginalRoutingKeyKey are where the message was first
	// published to; retries go straight to the queue, so they would be lost otherwise.
	OriginalExchangeKey   = "warren_original_exchange"
	OriginalRoutingKeyKey = "warren_original_routing_key"
	// RetryQueueKey is set by Backoff on a retry: the queue it retries the message in.
	// warren's subscriber believes the attempt bookkeeping (see IsAttemptBookkeeping) only
	// on a message that names the queue it consumes here.
	RetryQueueKey = "warren_retry_queue"
)

// IsBookkeeping reports whether a metadata key (or header) is the bookkeeping of one delivery
// of a message rather than part of the message. This is the one list (docs/headers.md has
// it as a table, with who writes and reads each key):
//
//   - warren's attempt bookkeeping: AttemptKey, FirstFailureKey, OriginalExchangeKey,
//     OriginalRoutingKeyKey, RetryQueueKey (see IsAttemptBookkeeping);
//   - the poison record: every key that starts with PoisonHeaderPrefix;
//   - what RabbitMQ writes (warren.IsBrokerHeader): x-death, x-first-death-*,
//     x-last-death-*, x-delivery-count;
//   - warren's transport headers (warren.IsTransportHeader): the delay levels' warren-dlx-*
//     and the publish id warren.PublishIDHeader;
//   - watermill-amqp's redelivered flag (amqp.MetadataRedeliveredKey).
//
// Everything else is the message's own and goes wherever the message goes: the body, the
// UUID, the AMQP properties (warren.MetadataContentType, ...), the user's headers and the
// trace context. (Delay instructions, warren.IsDelayMetadata, and warren.MetadataPublishID
// are neither: they are instructions to a publisher, which it consumes.)
//
// A message a handler sends on (an output, a copy of the message it received included, a
// reply, a message published through the router's Publisher) never carries bookkeeping:
// the router removes it (StripBookkeeping), so the message starts at attempt 1 wherever it
// goes next. A retry (Backoff) and a poison copy (Poison) are the same delivery going on,
// and keep it.
func IsBookkeeping(key string) bool {
	switch {
	case IsAttemptBookkeeping(key), strings.HasPrefix(key, PoisonHeaderPrefix),
		warren.IsBrokerHeader(key), warren.IsTransportHeader(key), key == wamqp.MetadataRedeliveredKey:
		return true
	}
	return false
}

// IsAttemptBookkeeping reports whether a metadata key is one of those that count a message's
// attempts in its queue: AttemptKey, FirstFailureKey, OriginalExchangeKey,
// OriginalRoutingKeyKey and RetryQueueKey. warren's subscriber keeps them only on a retry
// of the queue it consumes: a message that came straight to that queue (or through the delay
// levels addressed to it) and whose RetryQueueKey names it. On any other message they were
// not put there by warren's retry of this queue (a copy forwarded from another queue, a
// foreign or forged header) and are dropped: the message is at attempt 1.
func IsAttemptBookkeeping(key string) bool {
	switch key {
	case AttemptKey, FirstFailureKey, OriginalExchangeKey, OriginalRoutingKeyKey, RetryQueueKey:
		return true
	}
	return false
}

// StripBookkeeping removes every bookkeeping key (see IsBookkeeping) from md: what is left is
// the message's own.
func StripBookkeeping(md message.Metadata) {
	for k := range md {
		if IsBookkeeping(k) {
			delete(md, k)
		}
	}
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
