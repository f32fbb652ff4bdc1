package warren

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/warrenmq/warren/internal/contract"
)

// Origin is where a message was first published to: an exchange ("" is the default exchange)
// and a routing key. Retries go straight to the queue, so the bookkeeping keeps it.
type Origin struct {
	Exchange   string
	RoutingKey string
}

// AttemptRecord is warren's attempt bookkeeping of a delivery (the keys of
// IsAttemptBookkeeping): which attempt it is in its queue, since when it fails and where it
// was first published to. Backoff writes it on every retry, Poison on a poison copy.
// DecodeAttemptRecord is its one reader and Encode its one writer.
type AttemptRecord struct {
	// Attempt is the number of the attempt: 1 for the first delivery (AttemptKey absent).
	Attempt int
	// RetryQueue is the queue the message is retried in (RetryQueueKey); "" before a retry.
	RetryQueue string
	// FirstFailure is when the first attempt failed (FirstFailureKey); zero before.
	FirstFailure time.Time
	// Origin is where the message was first published to (OriginalExchangeKey,
	// OriginalRoutingKeyKey); nil when not recorded.
	Origin *Origin
}

// DecodeAttemptRecord reads the attempt bookkeeping of md. An attempt that is absent, or not
// a whole number of at least 1, is attempt 1; a first failure that is not an RFC 3339 time is
// none.
func DecodeAttemptRecord(md message.Metadata) AttemptRecord {
	r := AttemptRecord{Attempt: 1, RetryQueue: md[RetryQueueKey], FirstFailure: parseTime(md[FirstFailureKey])}
	if s := md[AttemptKey]; s != "" { // a first attempt has none: no error to make on every message
		if n, err := strconv.Atoi(s); err == nil && n > 1 {
			r.Attempt = n
		}
	}
	if exchange, ok := md[OriginalExchangeKey]; ok {
		r.Origin = &Origin{Exchange: exchange, RoutingKey: md[OriginalRoutingKeyKey]}
	}
	return r
}

// Encode replaces the attempt bookkeeping of md with r: AttemptKey when r.Attempt is above 1
// (the first attempt has none), RetryQueueKey when r.RetryQueue is set, FirstFailureKey
// (RFC 3339, UTC, nanoseconds) when r.FirstFailure is, the original exchange and routing key
// when r.Origin is.
func (r AttemptRecord) Encode(md message.Metadata) {
	for k := range md {
		if IsAttemptBookkeeping(k) {
			delete(md, k)
		}
	}
	if r.Attempt > 1 {
		md[AttemptKey] = strconv.Itoa(r.Attempt)
	}
	if r.RetryQueue != "" {
		md[RetryQueueKey] = r.RetryQueue
	}
	if !r.FirstFailure.IsZero() {
		md[FirstFailureKey] = formatTime(r.FirstFailure)
	}
	if r.Origin != nil {
		md[OriginalExchangeKey] = r.Origin.Exchange
		md[OriginalRoutingKeyKey] = r.Origin.RoutingKey
	}
}

// RecordFailure records a failure at now, unless an earlier attempt did: the first failure,
// and where the message was first published to, from the Delivery in ctx (see DeliveryFrom;
// left unknown without one).
func (r *AttemptRecord) RecordFailure(ctx context.Context, now time.Time) {
	if r.FirstFailure.IsZero() {
		r.FirstFailure = now
	}
	if r.Origin == nil {
		if d, ok := DeliveryFrom(ctx); ok {
			r.Origin = &Origin{Exchange: d.Exchange, RoutingKey: d.RoutingKey}
		}
	}
}

// Longest texts of a poison record: Encode cuts longer ones, to keep the headers well below
// the broker's frame size.
const (
	MaxPoisonErrorLen = 4 << 10  // PoisonRecord.Error, in bytes
	MaxPoisonStackLen = 16 << 10 // PoisonRecord.Stack, in bytes
)

// PoisonRecord is the poison record of a message: why it is in its poison queue. Both writers
// of poison copies, the Poison middleware (a message its handler gave up on) and warren's
// subscriber (a delivery it cannot unmarshal or read), write it with Encode or EncodeTable;
// ops, rpc and a poison queue's handler read it with DecodePoisonRecord.
type PoisonRecord struct {
	// Error is the error's text (PoisonErrorKey); Encode cuts it to MaxPoisonErrorLen bytes.
	Error string
	// ErrorType is the Go type of the innermost error of its chain.
	ErrorType string
	// Reason says why it was given up: a PoisonReason* value.
	Reason string
	// Handler is the Watermill handler's name; Queue the queue it was consumed from.
	Handler string
	Queue   string
	// Origin is where it was first published to; nil when not known (then Encode writes no
	// PoisonExchangeKey and PoisonRoutingKeyKey).
	Origin *Origin
	// Attempts is how many attempts were made.
	Attempts int
	// FirstFailure and LastFailure are when the first and the last attempt failed.
	FirstFailure time.Time
	LastFailure  time.Time
	// TraceID is the hex id of the trace the message belongs to; "" when none is known.
	TraceID string
	// Stack is a panic's goroutine stack; Encode cuts it to MaxPoisonStackLen bytes.
	Stack string
	// Expiration is the message's expiration property (MetadataExpiration), which a poison
	// copy does not carry: it would expire in the poison queue. A replay restores it.
	Expiration string
}

// Encode replaces the poison record of md (every key of IsPoisonBookkeeping, an earlier
// poisoning's included) with r. See EncodeTable.
func (r PoisonRecord) Encode(md message.Metadata) {
	for k := range md {
		if IsPoisonBookkeeping(k) {
			delete(md, k)
		}
	}
	r.encode(func(k, v string) { md[k] = v })
}

// EncodeTable replaces the poison record of the header table h with r; the values are
// strings. It writes what Encode writes: the error (cut to MaxPoisonErrorLen bytes), its type,
// the reason, handler, queue, attempts and the first and last failure times (RFC 3339, UTC,
// nanoseconds) always; the exchange and routing key when r.Origin is set; the trace id, the
// stack (cut to MaxPoisonStackLen bytes) and the expiration when they are not empty.
func (r PoisonRecord) EncodeTable(h amqp.Table) {
	for k := range h {
		if IsPoisonBookkeeping(k) {
			delete(h, k)
		}
	}
	r.encode(func(k, v string) { h[k] = v })
}

// encode is the one writer of the poison record's fields.
func (r PoisonRecord) encode(set func(key, value string)) {
	set(PoisonErrorKey, cut(r.Error, MaxPoisonErrorLen))
	set(PoisonErrorTypeKey, r.ErrorType)
	set(PoisonReasonKey, r.Reason)
	set(PoisonHandlerKey, r.Handler)
	set(PoisonQueueKey, r.Queue)
	if r.Origin != nil {
		set(PoisonExchangeKey, r.Origin.Exchange)
		set(PoisonRoutingKeyKey, r.Origin.RoutingKey)
	}
	set(PoisonAttemptsKey, strconv.Itoa(r.Attempts))
	set(PoisonFirstFailKey, formatTime(r.FirstFailure))
	set(PoisonLastFailKey, formatTime(r.LastFailure))
	for _, f := range [...]struct{ key, value string }{
		{PoisonTraceIDKey, r.TraceID},
		{PoisonStackKey, cut(r.Stack, MaxPoisonStackLen)},
		{PoisonExpirationKey, r.Expiration},
	} {
		if f.value != "" {
			set(f.key, f.value)
		}
	}
}

// DecodePoisonRecord reads the poison record of md. A number or time that does not parse is
// zero. Reason is PoisonReasonKey or, for a message the broker dead-lettered without warren's
// record, the reason of its latest dead-lettering (XLastDeathReasonHeader from RabbitMQ 3.13,
// else the newest entry of XDeathHeader): PoisonReasonDeliveryLimit, PoisonReasonRejected, or
// "dead-lettered by the broker: " and the broker's reason; "" for a message that is neither.
func DecodePoisonRecord(md message.Metadata) PoisonRecord {
	return decodePoison(func(k string) (string, bool) {
		v, ok := md[k]
		return v, ok
	})
}

// DecodePoisonTable reads the poison record of the header table h, as DecodePoisonRecord does
// (values that are not strings are read as Unmarshal reads them into metadata).
func DecodePoisonTable(h amqp.Table) PoisonRecord {
	return decodePoison(func(k string) (string, bool) {
		v, ok := h[k]
		return contract.HeaderString(v), ok
	})
}

// decodePoison is the one reader of the poison record's fields.
func decodePoison(get func(key string) (string, bool)) PoisonRecord {
	value := func(k string) string {
		v, _ := get(k)
		return v
	}
	r := PoisonRecord{
		Error: value(PoisonErrorKey), ErrorType: value(PoisonErrorTypeKey), Reason: value(PoisonReasonKey),
		Handler: value(PoisonHandlerKey), Queue: value(PoisonQueueKey),
		FirstFailure: parseTime(value(PoisonFirstFailKey)), LastFailure: parseTime(value(PoisonLastFailKey)),
		TraceID: value(PoisonTraceIDKey), Stack: value(PoisonStackKey), Expiration: value(PoisonExpirationKey),
	}
	r.Attempts, _ = strconv.Atoi(value(PoisonAttemptsKey))
	if exchange, ok := get(PoisonExchangeKey); ok {
		r.Origin = &Origin{Exchange: exchange, RoutingKey: value(PoisonRoutingKeyKey)}
	}
	if r.Reason == "" {
		r.Reason = deadLetterReason(value(XLastDeathReasonHeader), value(XDeathHeader))
	}
	return r
}

// deadLetterReason says why the broker dead-lettered a message, from its x-last-death-reason
// header, else from the newest entry of its x-death (as JSON); "" when
// neither says.
func deadLetterReason(lastReason, xDeath string) string {
	reason := lastReason
	if reason == "" {
		var deaths []struct {
			Reason string `json:"reason"`
		}
		if json.Unmarshal([]byte(xDeath), &deaths) == nil && len(deaths) > 0 {
			reason = deaths[0].Reason // the broker keeps the newest first
		}
	}
	switch reason {
	case "":
		return ""
	case "delivery_limit":
		return PoisonReasonDeliveryLimit
	case "rejected":
		return PoisonReasonRejected
	}
	return "dead-lettered by the broker: " + reason
}

// formatTime writes t as the bookkeeping keeps times: RFC 3339 in UTC, with nanoseconds; ""
// for the zero time.
func formatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// parseTime reads a time formatTime wrote (any RFC 3339 time); the zero time when s is none.
func parseTime(s string) time.Time {
	if s == "" { // absent, as on most messages: time.Parse would make an error to say so
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

// cut cuts s to at most n bytes, and marks the cut with an ellipsis. The cut falls between
// characters: a text cut inside a UTF-8 sequence would be invalid.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// isBrokerHeader reports whether the header is one RabbitMQ maintains itself (dead-lettering
// history, the quorum delivery count). Such headers are read but never published again.
func isBrokerHeader(name string) bool {
	return name == XDeliveryCountHeader ||
		strings.HasPrefix(name, XDeathHeader) ||
		strings.HasPrefix(name, xFirstDeathPrefix) ||
		strings.HasPrefix(name, xLastDeathPrefix)
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
//   - what RabbitMQ writes (isBrokerHeader): x-death, x-first-death-*, x-last-death-*,
//     x-delivery-count;
//   - warren's transport headers (the transport headers, contract.IsTransportHeader): the delay levels' warren-dlx-* and
//     the publish id (warren-dlx-id);
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
	case IsAttemptBookkeeping(key), IsPoisonBookkeeping(key), isBrokerHeader(key), contract.IsTransportHeader(key),
		key == MetadataRedelivered:
		return true
	}
	return false
}
