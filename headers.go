package warren

import (
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
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

// MetadataPublishID asks the DLX publisher for the message's publish id (header warren-dlx-id) (instead of a new
// random one). It is an instruction to the publisher: consumed by Publish, never sent, and
// dropped on unmarshal.
const MetadataPublishID = "warren_publish_id"

// Headers RabbitMQ writes itself (see IsBookkeeping). warren reads them and never publishes
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
	// amqp091-go's limits in the README); they are replaced by the header warren-unreadable-headers.
	PoisonReasonUnreadable = "headers unreadable"
	// PoisonReasonDeliveryLimit: a quorum work queue delivered the message as often as its
	// delivery limit allows, and no consumer settled it (each one crashed, lost its connection
	// or was stopped while it held the message).
	PoisonReasonDeliveryLimit = "delivery limit reached"
	// PoisonReasonRejected: a consumer rejected the message without requeueing it (warren does
	// for a message too large to publish as a poison copy; see DeadLetter).
	PoisonReasonRejected = "rejected by its consumer"
	// PoisonReasonSkipped: the message waited behind its order key, held after an earlier
	// message of the key was poisoned, and an operator skipped the key's held messages
	// (docs/ordering.md).
	PoisonReasonSkipped = "skipped while its key was held"
)

// ReplaysKey counts how many times a message was replayed from a poison or parking queue (ops
// replay). It is the message's own: it survives every hop.
const ReplaysKey = "warren_replays"

// RPCErrorKey marks an error reply (rpc): its value is the error text of the request's
// failure. The error reply also carries the request's poison record, without the stack.
const RPCErrorKey = "warren_rpc_error"
