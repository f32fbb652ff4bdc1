package warren

import (
	"strconv"
	"strings"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
)

// This file is warren's message contract: every header and metadata key that a part of warren
// reads or writes is declared here, and nowhere else (docs/headers.md has them as one table:
// who writes each, who reads it, whether it survives a hop). A message's metadata holds two
// kinds of keys, told apart by IsBookkeeping: the message's own, which go wherever the
// message goes, and a delivery's bookkeeping, which describes one trip through one queue.

// Metadata keys of the AMQP basic properties. Marshaler maps each property of a delivery to
// its key, and each key of a message back to the property, so that the properties survive
// handlers, retries, delays, the poison queue and a replay, and foreign AMQP clients see real
// properties. Values are strings: the timestamp in RFC 3339 (whole seconds, as AMQP keeps
// it), the priority in decimal (0–255), the expiration as AMQP writes it (milliseconds, in
// decimal).
const (
	MetadataContentType     = "amqp_content_type"
	MetadataContentEncoding = "amqp_content_encoding"
	MetadataCorrelationID   = "amqp_correlation_id"
	MetadataReplyTo         = "amqp_reply_to"
	MetadataType            = "amqp_type"
	MetadataAppID           = "amqp_app_id"
	MetadataUserID          = "amqp_user_id"
	MetadataTimestamp       = "amqp_timestamp"
	MetadataPriority        = "amqp_priority"
	MetadataExpiration      = "amqp_expiration"
)

// watermillUUIDHeader is where watermill-amqp's DefaultMarshaler keeps the message UUID.
// Marshaler reads it when a message has no AMQP message-id, so messages from plain
// watermill-amqp publishers keep their UUID, and writes it for a UUID longer than the
// message-id property holds.
const watermillUUIDHeader = "_watermill_message_uuid"

// MetadataRedelivered is watermill-amqp's redelivered flag ("true" on a message the broker
// delivered before). warren's subscriber sets it from the delivery, never from a header: it is
// bookkeeping.
const MetadataRedelivered = wamqp.MetadataRedeliveredKey

// Metadata keys of warren's delay API (see Delay and DeliverAt): instructions to the
// DLX publisher, which consumes them (see IsDelayMetadata).
const (
	MetadataDelay     = "warren_delay"      // a Go duration, relative to Publish
	MetadataDeliverAt = "warren_deliver_at" // an RFC 3339 time
)

// MetadataScheduleID makes a delayed message listable and cancellable under its value (see
// Schedule and package ledger): the DLX publisher records it in the ledger of its delay
// levels, and ledger.Ledger.Middleware checks it when the message arrives. The message's own:
// it goes wherever the message goes, its retries included.
const MetadataScheduleID = "warren_schedule_id"

// MetadataPublishID asks the DLX publisher for the message's PublishIDHeader (instead of a new
// random one). It is an instruction to the publisher: consumed by Publish, never sent, and
// dropped on unmarshal.
const MetadataPublishID = "warren_publish_id"

// TransportHeaderPrefix starts the names of warren's routing headers, which the DLX publisher
// sets on each publish and Unmarshal drops (see IsTransportHeader). The names deliberately do
// not start with "x-": a headers exchange ignores binding arguments that do.
const TransportHeaderPrefix = "warren-dlx-"

// PublishIDHeader carries the id the DLX publisher gives each message of a Publish call. It is
// the same on every copy of that publish (a re-send after a lost confirm, a redelivery after a
// lost ack) and new on every other publish (a replay, a new message): warren's subscriber
// recognises copies by it. A publish may ask for its id with MetadataPublishID: warren derives
// the ids of retries and of a handler's outputs from the message they come from, so that
// copies of a message make copies of its retry and outputs, which are recognised in turn. A
// transport header: dropped on unmarshal, never published again.
const PublishIDHeader = TransportHeaderPrefix + "id"

// Transport headers of the delay levels (see topology.Delay), set by the DLX publisher.
const (
	// DestExchangeHeader names the exchange a delayed message is delivered to; the delivery
	// exchange routes by it.
	DestExchangeHeader = TransportHeaderPrefix + "exchange"
	// DestQueueHeader names the queue a delayed message is delivered to (through the default
	// exchange); the delivery exchange routes by it.
	DestQueueHeader = TransportHeaderPrefix + "queue"
	// DueHeader is when a delayed message is due, in microseconds since the Unix epoch (an
	// int64), by the publisher's clock: its consumer measures how late it arrived.
	DueHeader = TransportHeaderPrefix + "due"
)

// DigitHeader is the header that carries the digit of delay position p; the level exchange of
// position p routes by it.
func DigitHeader(p int) string { return TransportHeaderPrefix + "p" + strconv.Itoa(p) }

// UnreadableHeader is the only header of a delivery whose headers the client library could
// not have read: the connection guard (amqpx.GuardConn) replaces the broker's header table
// with it, and its value says why. The body and the other properties are kept; warren's
// subscriber poisons such a delivery, and its poison copy keeps the header.
const UnreadableHeader = "warren-unreadable-headers"

// Headers RabbitMQ writes itself (see IsBrokerHeader). warren reads them and never publishes
// them again.
const (
	// XDeathHeader is the broker's dead-letter history: a table per queue and reason, the
	// newest first.
	XDeathHeader = "x-death"
	// XLastDeathReasonHeader is the reason of the latest dead-lettering (RabbitMQ 3.13 and
	// later).
	XLastDeathReasonHeader = "x-last-death-reason"
	// XDeliveryCountHeader counts a quorum queue's redeliveries of a message.
	XDeliveryCountHeader = "x-delivery-count"

	xFirstDeathPrefix = "x-first-death-"
	xLastDeathPrefix  = "x-last-death-"
)

// warren's attempt bookkeeping (see IsAttemptBookkeeping and AttemptRecord): what a retry of a
// message in its queue carries. The keys travel as headers and survive the delay levels and
// every retry of the message in its queue, but no hop to another queue.
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
	// warren's subscriber believes the attempt bookkeeping only on a message that names the
	// queue it consumes here.
	RetryQueueKey = "warren_retry_queue"
)

// PoisonHeaderPrefix starts the names of the poison record's keys (see PoisonRecord).
const PoisonHeaderPrefix = "warren_poison_"

// Keys of the poison record: the headers a poison copy gains, besides its own body and
// headers. PoisonRecord writes and reads them.
const (
	PoisonErrorKey      = "warren_poison_error"       // the error's text
	PoisonErrorTypeKey  = "warren_poison_error_type"  // the Go type of the innermost error
	PoisonReasonKey     = "warren_poison_reason"      // why it was given up: see PoisonReason*
	PoisonHandlerKey    = "warren_poison_handler"     // the Watermill handler's name
	PoisonQueueKey      = "warren_poison_queue"       // the queue it was consumed from
	PoisonExchangeKey   = "warren_poison_exchange"    // where it was first published: exchange
	PoisonRoutingKeyKey = "warren_poison_routing_key" // and routing key
	PoisonAttemptsKey   = "warren_poison_attempts"    // how many attempts were made
	PoisonFirstFailKey  = "warren_poison_first_failure"
	PoisonLastFailKey   = "warren_poison_last_failure"
	PoisonTraceIDKey    = "warren_poison_trace_id" // the trace the message belongs to
	PoisonStackKey      = "warren_poison_stack"    // for a panic: the goroutine's stack
	// PoisonExpirationKey keeps the message's expiration (MetadataExpiration), which the
	// poison copy does not carry as its property: it would expire in the poison queue. A
	// replay (ops) restores the property.
	PoisonExpirationKey = "warren_poison_expiration"
)

// Values of PoisonReasonKey, and the reasons DecodePoisonRecord reads from the broker's
// dead-letter headers of a message it dead-lettered into a poison queue itself.
const (
	// PoisonReasonPermanent: the handler returned a permanent error.
	PoisonReasonPermanent = "permanent error"
	// PoisonReasonExhausted: the last attempt failed.
	PoisonReasonExhausted = "attempts exhausted"
	// PoisonReasonUndecoded: the subscriber's Marshaler could not unmarshal the delivery.
	PoisonReasonUndecoded = "cannot be unmarshaled"
	// PoisonReasonUnreadable: the client library could not read the message's headers (see
	// amqp091-go's limits in the README); they are replaced by UnreadableHeader.
	PoisonReasonUnreadable = "headers unreadable"
	// PoisonReasonDeliveryLimit: a quorum work queue delivered the message as often as its
	// delivery limit allows, and no consumer settled it (each one crashed, lost its connection
	// or was stopped while it held the message).
	PoisonReasonDeliveryLimit = "delivery limit reached"
	// PoisonReasonRejected: a consumer rejected the message without requeueing it (warren does
	// for a message too large to publish as a poison copy; see DeadLetter).
	PoisonReasonRejected = "rejected by its consumer"
)

// ReplaysKey counts how many times a message was replayed from a poison or parking queue (ops
// replay). It is the message's own: it survives every hop.
const ReplaysKey = "warren_replays"

// RPCErrorKey marks an error reply (rpc): its value is the error text of the request's
// failure. The error reply also carries the request's poison record, without the stack.
const RPCErrorKey = "warren_rpc_error"

// IsBrokerHeader reports whether the header is one RabbitMQ maintains itself (dead-lettering
// history, the quorum delivery count). Such headers are read but never published again.
func IsBrokerHeader(name string) bool {
	return name == XDeliveryCountHeader ||
		strings.HasPrefix(name, XDeathHeader) ||
		strings.HasPrefix(name, xFirstDeathPrefix) ||
		strings.HasPrefix(name, xLastDeathPrefix)
}

// IsTransportHeader reports whether the header is one of warren's own routing headers
// (delay digits, the delayed message's destination and due time, the publish id). They are
// set by the DLX publisher, never taken from metadata, and dropped on unmarshal.
func IsTransportHeader(name string) bool {
	return strings.HasPrefix(name, TransportHeaderPrefix)
}

// IsDelayMetadata reports whether the metadata key asks a publisher to delay the message:
// MetadataDelay, MetadataDeliverAt, and Watermill's components/delay keys. They are
// instructions to a publisher, not part of a message: a delivered message has been delayed
// already. Unmarshal drops them, so that a message forwarded as it was received goes at once,
// and a foreign value (a garbage duration, a time in the year 2999) never makes the forward
// fail.
func IsDelayMetadata(key string) bool {
	switch key {
	case MetadataDelay, MetadataDeliverAt, delay.DelayedForKey, delay.DelayedUntilKey:
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

// IsPoisonBookkeeping reports whether a metadata key belongs to the poison record (it starts
// with PoisonHeaderPrefix). warren's subscriber keeps the record only on a message that came
// straight to the queue it consumes (a poison queue's consumer reads it).
func IsPoisonBookkeeping(key string) bool {
	return strings.HasPrefix(key, PoisonHeaderPrefix)
}

// IsBookkeeping reports whether a metadata key (or header) is the bookkeeping of one delivery
// of a message rather than part of the message. This is the one list (docs/headers.md has
// it as a table, with who writes and reads each key):
//
//   - warren's attempt bookkeeping (IsAttemptBookkeeping);
//   - the poison record (IsPoisonBookkeeping);
//   - what RabbitMQ writes (IsBrokerHeader): x-death, x-first-death-*, x-last-death-*,
//     x-delivery-count;
//   - warren's transport headers (IsTransportHeader): the delay levels' warren-dlx-* and
//     the publish id PublishIDHeader;
//   - watermill-amqp's redelivered flag (MetadataRedelivered).
//
// Everything else is the message's own and goes wherever the message goes: the body, the
// UUID, the AMQP properties (MetadataContentType, ...), the user's headers, the trace context
// and ReplaysKey. (Delay instructions, IsDelayMetadata, and MetadataPublishID are neither:
// they are instructions to a publisher, which it consumes.)
//
// A message a handler sends on (an output, a copy of the message it received included, a
// reply, a message published through the router's Publisher) never carries bookkeeping:
// the router removes it (StripBookkeeping), so the message starts at attempt 1 wherever it
// goes next. A retry (Backoff) and a poison copy (Poison) are the same delivery going on,
// and keep it.
func IsBookkeeping(key string) bool {
	switch {
	case IsAttemptBookkeeping(key), IsPoisonBookkeeping(key), IsBrokerHeader(key), IsTransportHeader(key),
		key == MetadataRedelivered:
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
