package middleware

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
)

// poisonHeaders returns msg's headers named warren_poison_*.
func poisonHeaders(msg *message.Message) map[string]string {
	h := map[string]string{}
	for k, v := range msg.Metadata {
		if strings.HasPrefix(k, warren.PoisonHeaderPrefix) {
			h[k] = v
		}
	}
	return h
}

// A first poisoning: every header from the error, the reason, the queue, the delivery, the
// attempt header and the trace, and the message is no longer delayed.
func TestSetPoisonHeaders(t *testing.T) {
	now := time.Date(2024, 5, 6, 9, 8, 9, 123456789, time.FixedZone("CEST", 2*3600))
	var v any
	jsonErr := json.Unmarshal([]byte("{"), &v)
	require.Error(t, jsonErr)
	err := warren.Permanent(fmt.Errorf("decode order: %w", jsonErr))

	traceID := trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: trace.SpanID{0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}, TraceFlags: trace.FlagsSampled,
	}))
	ctx = contract.WithDelivery(ctx, contract.Delivery{Queue: "orders.q", Exchange: "orders", RoutingKey: "order.created"})
	msg := message.NewMessage("m1", []byte("{"))
	msg.Metadata = message.Metadata{
		"app": "kept", warren.AttemptKey: "3",
		delay.DelayedForKey: "1m0s", delay.DelayedUntilKey: "2024-05-06T07:09:09Z", warren.MetadataDeliverAt: "2024-05-06T07:09:09Z",
	}
	msg.SetContext(ctx)

	setPoisonHeaders(msg, err, warren.PoisonReasonPermanent, "orders.q", now)

	at := "2024-05-06T07:08:09.123456789Z"
	assert.Equal(t, map[string]string{
		warren.PoisonErrorKey:      "permanent: decode order: unexpected end of JSON input",
		warren.PoisonErrorTypeKey:  "*json.SyntaxError",
		warren.PoisonReasonKey:     warren.PoisonReasonPermanent,
		warren.PoisonHandlerKey:    "", // no Watermill handler in the context (see TestSetPoisonHeadersNamesTheHandler)
		warren.PoisonQueueKey:      "orders.q",
		warren.PoisonExchangeKey:   "orders",
		warren.PoisonRoutingKeyKey: "order.created",
		warren.PoisonAttemptsKey:   "3",
		warren.PoisonFirstFailKey:  at,
		warren.PoisonLastFailKey:   at,
		warren.PoisonTraceIDKey:    "4bf92f3577b34da6a3ce929d0e0e4736",
	}, poisonHeaders(msg))
	assert.Equal(t, "kept", msg.Metadata.Get("app"))
	assert.Equal(t, at, msg.Metadata.Get(warren.FirstFailureKey))
	assert.Equal(t, "orders", msg.Metadata.Get(warren.OriginalExchangeKey))
	assert.Equal(t, "order.created", msg.Metadata.Get(warren.OriginalRoutingKeyKey))
	assert.Equal(t, "0s", msg.Metadata.Get(warren.MetadataDelay), "published at once, whatever delay it carried")
	assert.NotContains(t, msg.Metadata, warren.MetadataDeliverAt)
}

// A message poisoned before (replayed from its poison queue and failed again) keeps none of
// the earlier poison headers, but keeps when it first failed and where it was first
// published.
func TestSetPoisonHeadersReplacesEarlierOnes(t *testing.T) {
	now := time.Date(2024, 6, 1, 12, 0, 0, 0, time.UTC)
	msg := message.NewMessage("m1", nil)
	msg.Metadata = message.Metadata{
		warren.FirstFailureKey: "2024-01-01T00:00:00Z", warren.OriginalExchangeKey: "orders", warren.OriginalRoutingKeyKey: "order.created",
		warren.PoisonErrorKey: "panic: nil map", warren.PoisonErrorTypeKey: "*middleware.PanicError", warren.PoisonReasonKey: warren.PoisonReasonExhausted,
		warren.PoisonHandlerKey: "old", warren.PoisonQueueKey: "old.q", warren.PoisonExchangeKey: "old-x", warren.PoisonRoutingKeyKey: "old-key",
		warren.PoisonAttemptsKey: "5", warren.PoisonFirstFailKey: "2023-01-01T00:00:00Z", warren.PoisonLastFailKey: "2023-01-02T00:00:00Z",
		warren.PoisonTraceIDKey: "0af7651916cd43dd8448eb211c80319c", warren.PoisonStackKey: "goroutine 1 [running]:",
		"warren_poison_from_a_later_version": "x",
	}
	// Replayed by hand from the poison queue, through the default exchange.
	msg.SetContext(contract.WithDelivery(context.Background(), contract.Delivery{Queue: "orders.q", RoutingKey: "orders.q"}))

	setPoisonHeaders(msg, errors.New("still failing"), warren.PoisonReasonExhausted, "orders.q", now)

	assert.Equal(t, map[string]string{
		warren.PoisonErrorKey:      "still failing",
		warren.PoisonErrorTypeKey:  "*errors.errorString",
		warren.PoisonReasonKey:     warren.PoisonReasonExhausted,
		warren.PoisonHandlerKey:    "",
		warren.PoisonQueueKey:      "orders.q",
		warren.PoisonExchangeKey:   "orders",
		warren.PoisonRoutingKeyKey: "order.created",
		warren.PoisonAttemptsKey:   "1",
		warren.PoisonFirstFailKey:  "2024-01-01T00:00:00Z",
		warren.PoisonLastFailKey:   "2024-06-01T12:00:00Z",
	}, poisonHeaders(msg))
	assert.Equal(t, "2024-01-01T00:00:00Z", msg.Metadata.Get(warren.FirstFailureKey))
}

// Without a delivery in the context nor an original destination recorded, there is no
// exchange header; the attempt comes from the context RetryCount set.
func TestSetPoisonHeadersWithoutDelivery(t *testing.T) {
	msg := message.NewMessage("m1", nil)
	msg.Metadata.Set(warren.AttemptKey, "9")
	msg.SetContext(context.WithValue(context.Background(), attemptKey{}, 2))
	setPoisonHeaders(msg, errors.New("boom"), warren.PoisonReasonExhausted, "q", time.Unix(0, 0))
	h := poisonHeaders(msg)
	assert.NotContains(t, h, warren.PoisonExchangeKey)
	assert.NotContains(t, h, warren.PoisonRoutingKeyKey)
	assert.NotContains(t, h, warren.PoisonTraceIDKey)
	assert.NotContains(t, h, warren.PoisonStackKey)
	assert.Equal(t, "2", h[warren.PoisonAttemptsKey])
	assert.Equal(t, "1970-01-01T00:00:00Z", h[warren.PoisonFirstFailKey])
}

// A panic's stack is kept, even when the error wraps the *PanicError.
func TestSetPoisonHeadersKeepsPanicStack(t *testing.T) {
	stack := "goroutine 7 [running]:\nmain.handle(...)\n\t/app/main.go:42 +0x1d\n"
	msg := message.NewMessage("m1", nil)
	err := fmt.Errorf("attempt 3: %w", &PanicError{Value: "nil map", Stack: stack})
	setPoisonHeaders(msg, err, warren.PoisonReasonExhausted, "q", time.Now())
	assert.Equal(t, stack, msg.Metadata.Get(warren.PoisonStackKey))
	assert.Equal(t, "attempt 3: panic: nil map", msg.Metadata.Get(warren.PoisonErrorKey))
	assert.Equal(t, "*middleware.PanicError", msg.Metadata.Get(warren.PoisonErrorTypeKey))
}

// Error texts and stacks too long for a header are cut, with an ellipsis, and stay valid
// UTF-8; texts at the limit are kept whole.
func TestSetPoisonHeadersCutsLongTexts(t *testing.T) {
	long := strings.Repeat("x", warren.MaxPoisonErrorLen+100)
	msg := message.NewMessage("m1", nil)
	setPoisonHeaders(msg, errors.New(long), warren.PoisonReasonExhausted, "q", time.Now())
	assert.Equal(t, long[:warren.MaxPoisonErrorLen]+"…", msg.Metadata.Get(warren.PoisonErrorKey))

	atLimit := strings.Repeat("y", warren.MaxPoisonErrorLen)
	setPoisonHeaders(msg, errors.New(atLimit), warren.PoisonReasonExhausted, "q", time.Now())
	assert.Equal(t, atLimit, msg.Metadata.Get(warren.PoisonErrorKey))

	stack := strings.Repeat("s", warren.MaxPoisonStackLen*2)
	setPoisonHeaders(msg, &PanicError{Value: 1, Stack: stack}, warren.PoisonReasonExhausted, "q", time.Now())
	assert.Equal(t, stack[:warren.MaxPoisonStackLen]+"…", msg.Metadata.Get(warren.PoisonStackKey))

	// A cut that would fall inside a multi-byte character falls before it.
	wide := "x" + strings.Repeat("é", warren.MaxPoisonErrorLen) // 'é' is 2 bytes: byte warren.MaxPoisonErrorLen is inside one
	setPoisonHeaders(msg, errors.New(wide), warren.PoisonReasonExhausted, "q", time.Now())
	got := msg.Metadata.Get(warren.PoisonErrorKey)
	assert.True(t, utf8.ValidString(got), "invalid UTF-8 at the end: %q", got[len(got)-8:])
	assert.True(t, got == wide[:warren.MaxPoisonErrorLen-1]+"…", "cut at %d bytes, want %d", len(got)-len("…"), warren.MaxPoisonErrorLen-1)
}

// The handler header names the Watermill handler that failed (the router puts its name in
// the message's context).
func TestSetPoisonHeadersNamesTheHandler(t *testing.T) {
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	r, err := message.NewRouter(message.RouterConfig{}, logger)
	require.NoError(t, err)
	got := make(chan message.Metadata, 1)
	r.AddConsumerHandler("orders-handler", "orders", pubSub, func(msg *message.Message) error {
		setPoisonHeaders(msg, errors.New("boom"), warren.PoisonReasonExhausted, "orders.q", time.Now())
		got <- msg.Metadata
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- r.Run(ctx) }()
	select {
	case <-r.Running():
	case err := <-ran:
		require.FailNow(t, "the router did not start", "%v", err)
	}
	require.NoError(t, pubSub.Publish("orders", message.NewMessage("m1", nil)))

	select {
	case md := <-got:
		assert.Equal(t, "orders-handler", md.Get(warren.PoisonHandlerKey))
	case <-time.After(testenv.Patience()):
		require.FailNow(t, "the handler was not called")
	}
	cancel()
	require.NoError(t, <-ran)
	require.NoError(t, pubSub.Close())
}

// The expiration moves to a poison header (a poison copy never expires); the other
// properties stay. An earlier poisoning's kept expiration is replaced like every poison
// header; without an expiration, none is kept.
func TestSetPoisonHeadersMovesTheExpiration(t *testing.T) {
	msg := message.NewMessage("m1", nil)
	msg.Metadata = message.Metadata{warren.MetadataExpiration: "60000", warren.MetadataPriority: "9",
		warren.MetadataCorrelationID: "c", warren.PoisonExpirationKey: "1"}
	setPoisonHeaders(msg, errors.New("boom"), warren.PoisonReasonExhausted, "q", time.Unix(0, 0))
	assert.NotContains(t, msg.Metadata, warren.MetadataExpiration)
	assert.Equal(t, "60000", msg.Metadata.Get(warren.PoisonExpirationKey))
	assert.Equal(t, "9", msg.Metadata.Get(warren.MetadataPriority))
	assert.Equal(t, "c", msg.Metadata.Get(warren.MetadataCorrelationID))
	pub, err := warren.Marshaler{}.Marshal(msg)
	require.NoError(t, err)
	assert.Empty(t, pub.Expiration)

	msg = message.NewMessage("m2", nil)
	msg.Metadata.Set(warren.PoisonExpirationKey, "1")
	setPoisonHeaders(msg, errors.New("boom"), warren.PoisonReasonExhausted, "q", time.Unix(0, 0))
	assert.NotContains(t, msg.Metadata, warren.PoisonExpirationKey)
}
