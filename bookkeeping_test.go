package warren_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
)

// The wire form of the poison record: every key, and the values as the writers of poison
// copies have always written them (times in UTC with nanoseconds, attempts in decimal).
func TestPoisonRecordEncode(t *testing.T) {
	first := time.Date(2024, 5, 6, 9, 8, 9, 123456789, time.FixedZone("CEST", 2*3600))
	last := time.Date(2024, 5, 6, 7, 9, 0, 0, time.UTC)
	md := message.Metadata{"app": "kept", warren.PoisonReasonKey: "of an earlier poisoning",
		"warren_poison_from_a_later_version": "x", warren.PoisonStackKey: "old stack"}
	warren.PoisonRecord{
		Error: "decode order: unexpected end of JSON input", ErrorType: "*json.SyntaxError", Reason: warren.PoisonReasonPermanent,
		Handler: "orders-handler", Queue: "orders.q", Origin: &warren.Origin{Exchange: "orders", RoutingKey: "order.created"},
		Attempts: 3, FirstFailure: first, LastFailure: last, TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", Expiration: "60000",
	}.Encode(md)
	assert.Equal(t, message.Metadata{
		"app":                         "kept",
		"warren_poison_error":         "decode order: unexpected end of JSON input",
		"warren_poison_error_type":    "*json.SyntaxError",
		"warren_poison_reason":        "permanent error",
		"warren_poison_handler":       "orders-handler",
		"warren_poison_queue":         "orders.q",
		"warren_poison_exchange":      "orders",
		"warren_poison_routing_key":   "order.created",
		"warren_poison_attempts":      "3",
		"warren_poison_first_failure": "2024-05-06T07:08:09.123456789Z",
		"warren_poison_last_failure":  "2024-05-06T07:09:00Z",
		"warren_poison_trace_id":      "4bf92f3577b34da6a3ce929d0e0e4736",
		"warren_poison_expiration":    "60000",
	}, md, "an earlier record is replaced whole, the message's own metadata kept")

	// Unknown parts are left out: no origin, trace, stack or expiration.
	h := amqp.Table{"app": "kept", warren.PoisonTraceIDKey: "of an earlier poisoning"}
	warren.PoisonRecord{Error: "boom", ErrorType: "*errors.errorString", Reason: warren.PoisonReasonExhausted,
		Queue: "q", Attempts: 1, FirstFailure: last, LastFailure: last}.EncodeTable(h)
	assert.Equal(t, amqp.Table{
		"app":                         "kept",
		"warren_poison_error":         "boom",
		"warren_poison_error_type":    "*errors.errorString",
		"warren_poison_reason":        "attempts exhausted",
		"warren_poison_handler":       "",
		"warren_poison_queue":         "q",
		"warren_poison_attempts":      "1",
		"warren_poison_first_failure": "2024-05-06T07:09:00Z",
		"warren_poison_last_failure":  "2024-05-06T07:09:00Z",
	}, h)
}

// What Encode writes, DecodePoisonRecord and DecodePoisonTable read back the same, and
// encoding that again changes nothing (an rpc error reply re-encodes the request's record).
func TestPoisonRecordRoundTrip(t *testing.T) {
	at := time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC)
	record := warren.PoisonRecord{
		Error: strings.Repeat("é", warren.MaxPoisonErrorLen), ErrorType: "*middleware.PanicError", Reason: warren.PoisonReasonExhausted,
		Handler: "h", Queue: "q", Origin: &warren.Origin{Exchange: "", RoutingKey: "q"}, Attempts: 4,
		FirstFailure: at, LastFailure: at.Add(time.Second), TraceID: "0af7651916cd43dd8448eb211c80319c",
		Stack: strings.Repeat("s", warren.MaxPoisonStackLen+1), Expiration: "5000",
	}
	md := message.Metadata{}
	record.Encode(md)
	decoded := warren.DecodePoisonRecord(md)
	assert.Equal(t, md[warren.PoisonErrorKey], decoded.Error, "decoded as written: cut")
	assert.Equal(t, md[warren.PoisonStackKey], decoded.Stack)
	want := record
	want.Error, want.Stack = decoded.Error, decoded.Stack
	assert.Equal(t, want, decoded)

	again := message.Metadata{}
	decoded.Encode(again)
	assert.Equal(t, md, again, "a cut text is not cut again")

	table := amqp.Table{}
	record.EncodeTable(table)
	assert.Equal(t, decoded, warren.DecodePoisonTable(table))
	assert.Equal(t, warren.PoisonRecord{}, warren.DecodePoisonRecord(message.Metadata{"app": "x"}), "no record")
}

// Error texts and stacks too long for a header are cut, with an ellipsis, and stay valid
// UTF-8; texts at the limit are kept whole.
func TestPoisonRecordCutsLongTexts(t *testing.T) {
	encoded := func(r warren.PoisonRecord) message.Metadata {
		md := message.Metadata{}
		r.Encode(md)
		return md
	}
	long := strings.Repeat("x", warren.MaxPoisonErrorLen+100)
	assert.Equal(t, long[:warren.MaxPoisonErrorLen]+"…", encoded(warren.PoisonRecord{Error: long})[warren.PoisonErrorKey])
	atLimit := strings.Repeat("y", warren.MaxPoisonErrorLen)
	assert.Equal(t, atLimit, encoded(warren.PoisonRecord{Error: atLimit})[warren.PoisonErrorKey])
	stack := strings.Repeat("s", warren.MaxPoisonStackLen*2)
	assert.Equal(t, stack[:warren.MaxPoisonStackLen]+"…", encoded(warren.PoisonRecord{Stack: stack})[warren.PoisonStackKey])

	wide := "x" + strings.Repeat("é", warren.MaxPoisonErrorLen) // 'é' is 2 bytes: byte MaxPoisonErrorLen is inside one
	assert.Equal(t, wide[:warren.MaxPoisonErrorLen-1]+"…", encoded(warren.PoisonRecord{Error: wide})[warren.PoisonErrorKey])
}

// A message the broker dead-lettered into a poison queue has no record of warren's: its
// reason comes from x-last-death-reason, else from the newest x-death entry, as a table
// (DecodePoisonTable) or as the JSON the Marshaler makes of it (DecodePoisonRecord).
func TestDecodePoisonRecordReadsTheBrokersReason(t *testing.T) {
	deaths := []any{amqp.Table{"reason": "delivery_limit", "queue": "q"}, amqp.Table{"reason": "expired", "queue": "level"}}
	assert.Equal(t, warren.PoisonReasonDeliveryLimit, warren.DecodePoisonTable(amqp.Table{warren.XDeathHeader: deaths}).Reason)
	assert.Equal(t, warren.PoisonReasonDeliveryLimit,
		warren.DecodePoisonRecord(message.Metadata{warren.XDeathHeader: contract.HeaderString(deaths)}).Reason)
	assert.Equal(t, warren.PoisonReasonRejected,
		warren.DecodePoisonRecord(message.Metadata{warren.XLastDeathReasonHeader: "rejected", warren.XDeathHeader: "[]"}).Reason)
	assert.Equal(t, "dead-lettered by the broker: maxlen",
		warren.DecodePoisonRecord(message.Metadata{warren.XLastDeathReasonHeader: "maxlen"}).Reason)
	assert.Equal(t, warren.PoisonReasonPermanent, warren.DecodePoisonRecord(message.Metadata{
		warren.PoisonReasonKey: warren.PoisonReasonPermanent, warren.XLastDeathReasonHeader: "rejected"}).Reason, "warren's record wins")
	assert.Empty(t, warren.DecodePoisonRecord(message.Metadata{warren.XDeathHeader: "not json"}).Reason)
}

// The attempt bookkeeping: read with its defaults, written back as it was, a failure
// recorded once.
func TestAttemptRecord(t *testing.T) {
	assert.Equal(t, warren.AttemptRecord{Attempt: 1}, warren.DecodeAttemptRecord(message.Metadata{}))
	for _, v := range []string{"0", "-3", "x", "1"} {
		assert.Equal(t, 1, warren.DecodeAttemptRecord(message.Metadata{warren.AttemptKey: v}).Attempt, v)
	}

	md := message.Metadata{"app": "kept", warren.AttemptKey: "3", warren.RetryQueueKey: "q", warren.FirstFailureKey: "2024-01-01T00:00:00Z",
		warren.OriginalExchangeKey: "", warren.OriginalRoutingKeyKey: "q"}
	r := warren.DecodeAttemptRecord(md)
	assert.Equal(t, warren.AttemptRecord{Attempt: 3, RetryQueue: "q", FirstFailure: time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC),
		Origin: &warren.Origin{RoutingKey: "q"}}, r)
	written := message.Metadata{"app": "kept", warren.AttemptKey: "7"}
	r.Encode(written)
	assert.Equal(t, md, written)

	// A recorded failure is kept; a first one takes the time and the delivery's origin.
	now := time.Date(2024, 6, 1, 12, 0, 0, 0, time.UTC)
	ctx := contract.WithDelivery(context.Background(), contract.Delivery{Queue: "q", Exchange: "orders", RoutingKey: "order.created"})
	r.RecordFailure(ctx, now)
	assert.Equal(t, time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC), r.FirstFailure)
	assert.Equal(t, &warren.Origin{RoutingKey: "q"}, r.Origin)
	first := warren.AttemptRecord{Attempt: 1}
	first.RecordFailure(ctx, now)
	assert.Equal(t, warren.AttemptRecord{Attempt: 1, FirstFailure: now, Origin: &warren.Origin{Exchange: "orders", RoutingKey: "order.created"}}, first)
	first.RecordFailure(context.Background(), now.Add(time.Hour))
	assert.Equal(t, now, first.FirstFailure)
	alone := warren.AttemptRecord{Attempt: 1}
	alone.RecordFailure(context.Background(), now)
	assert.Nil(t, alone.Origin, "no delivery: the origin stays unknown")

	out := message.Metadata{warren.AttemptKey: "2", warren.RetryQueueKey: "old"}
	warren.AttemptRecord{Attempt: 1}.Encode(out)
	assert.Empty(t, out, "the first attempt has no bookkeeping")
}

// The one list of what is a delivery's bookkeeping and what is the message's own.
func TestIsBookkeeping(t *testing.T) {
	for _, k := range []string{
		warren.AttemptKey, warren.FirstFailureKey, warren.OriginalExchangeKey, warren.OriginalRoutingKeyKey, warren.RetryQueueKey,
		warren.PoisonErrorKey, warren.PoisonExpirationKey, warren.PoisonHeaderPrefix + "later",
		warren.XDeathHeader, "x-first-death-queue", warren.XLastDeathReasonHeader, warren.XDeliveryCountHeader,
		contract.PublishIDHeader, contract.DestQueueHeader, contract.DestExchangeHeader, contract.DueHeader, contract.DigitHeader(3),
		warren.MetadataRedelivered,
	} {
		assert.True(t, warren.IsBookkeeping(k), k)
	}
	for _, k := range []string{
		warren.MetadataContentType, warren.MetadataExpiration, warren.ReplaysKey, warren.RPCErrorKey, contract.UnreadableHeader,
		"traceparent", "tenant", warren.MetadataDelay, warren.MetadataPublishID,
	} {
		assert.False(t, warren.IsBookkeeping(k), k)
	}
}
