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
	"github.com/warrenmq/warren/dlx"
)

// poisonHeaders returns msg's headers named warren_poison_*.
func poisonHeaders(msg *message.Message) map[string]string {
	h := map[string]string{}
	for k, v := range msg.Metadata {
		if strings.HasPrefix(k, PoisonHeaderPrefix) {
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
	ctx = warren.WithDelivery(ctx, warren.Delivery{Queue: "orders.q", Exchange: "orders", RoutingKey: "order.created"})
	msg := message.NewMessage("m1", []byte("{"))
	msg.Metadata = message.Metadata{
		"app": "kept", AttemptKey: "3",
		delay.DelayedForKey: "1m0s", delay.DelayedUntilKey: "2024-05-06T07:09:09Z", dlx.MetadataDeliverAt: "2024-05-06T07:09:09Z",
	}
	msg.SetContext(ctx)

	SetPoisonHeaders(msg, err, PoisonReasonPermanent, "orders.q", now)

	at := "2024-05-06T07:08:09.123456789Z"
	assert.Equal(t, map[string]string{
		PoisonErrorKey:      "permanent: decode order: unexpected end of JSON input",
		PoisonErrorTypeKey:  "*json.SyntaxError",
		PoisonReasonKey:     PoisonReasonPermanent,
		PoisonHandlerKey:    "", // no Watermill handler in the context (see TestSetPoisonHeadersNamesTheHandler)
		PoisonQueueKey:      "orders.q",
		PoisonExchangeKey:   "orders",
		PoisonRoutingKeyKey: "order.created",
		PoisonAttemptsKey:   "3",
		PoisonFirstFailKey:  at,
		PoisonLastFailKey:   at,
		PoisonTraceIDKey:    "4bf92f3577b34da6a3ce929d0e0e4736",
	}, poisonHeaders(msg))
	assert.Equal(t, "kept", msg.Metadata.Get("app"))
	assert.Equal(t, at, msg.Metadata.Get(FirstFailureKey))
	assert.Equal(t, "orders", msg.Metadata.Get(OriginalExchangeKey))
	assert.Equal(t, "order.created", msg.Metadata.Get(OriginalRoutingKeyKey))
	assert.Equal(t, "0s", msg.Metadata.Get(dlx.MetadataDelay), "published at once, whatever delay it carried")
	assert.NotContains(t, msg.Metadata, dlx.MetadataDeliverAt)
}

// A message poisoned before (replayed from its poison queue and failed again) keeps none of
// the earlier poison headers, but keeps when it first failed and where it was first
// published.
func TestSetPoisonHeadersReplacesEarlierOnes(t *testing.T) {
	now := time.Date(2024, 6, 1, 12, 0, 0, 0, time.UTC)
	msg := message.NewMessage("m1", nil)
	msg.Metadata = message.Metadata{
		FirstFailureKey: "2024-01-01T00:00:00Z", OriginalExchangeKey: "orders", OriginalRoutingKeyKey: "order.created",
		PoisonErrorKey: "panic: nil map", PoisonErrorTypeKey: "*middleware.PanicError", PoisonReasonKey: PoisonReasonExhausted,
		PoisonHandlerKey: "old", PoisonQueueKey: "old.q", PoisonExchangeKey: "old-x", PoisonRoutingKeyKey: "old-key",
		PoisonAttemptsKey: "5", PoisonFirstFailKey: "2023-01-01T00:00:00Z", PoisonLastFailKey: "2023-01-02T00:00:00Z",
		PoisonTraceIDKey: "0af7651916cd43dd8448eb211c80319c", PoisonStackKey: "goroutine 1 [running]:",
		"warren_poison_from_a_later_version": "x",
	}
	// Replayed by hand from the poison queue, through the default exchange.
	msg.SetContext(warren.WithDelivery(context.Background(), warren.Delivery{Queue: "orders.q", RoutingKey: "orders.q"}))

	SetPoisonHeaders(msg, errors.New("still failing"), PoisonReasonExhausted, "orders.q", now)

	assert.Equal(t, map[string]string{
		PoisonErrorKey:      "still failing",
		PoisonErrorTypeKey:  "*errors.errorString",
		PoisonReasonKey:     PoisonReasonExhausted,
		PoisonHandlerKey:    "",
		PoisonQueueKey:      "orders.q",
		PoisonExchangeKey:   "orders",
		PoisonRoutingKeyKey: "order.created",
		PoisonAttemptsKey:   "1",
		PoisonFirstFailKey:  "2024-01-01T00:00:00Z",
		PoisonLastFailKey:   "2024-06-01T12:00:00Z",
	}, poisonHeaders(msg))
	assert.Equal(t, "2024-01-01T00:00:00Z", msg.Metadata.Get(FirstFailureKey))
}

// Without a delivery in the context nor an original destination recorded, there is no
// exchange header; the attempt comes from the context RetryCount set.
func TestSetPoisonHeadersWithoutDelivery(t *testing.T) {
	msg := message.NewMessage("m1", nil)
	msg.Metadata.Set(AttemptKey, "9")
	msg.SetContext(context.WithValue(context.Background(), attemptKey{}, 2))
	SetPoisonHeaders(msg, errors.New("boom"), PoisonReasonExhausted, "q", time.Unix(0, 0))
	h := poisonHeaders(msg)
	assert.NotContains(t, h, PoisonExchangeKey)
	assert.NotContains(t, h, PoisonRoutingKeyKey)
	assert.NotContains(t, h, PoisonTraceIDKey)
	assert.NotContains(t, h, PoisonStackKey)
	assert.Equal(t, "2", h[PoisonAttemptsKey])
	assert.Equal(t, "1970-01-01T00:00:00Z", h[PoisonFirstFailKey])
}

// A panic's stack is kept, even when the error wraps the *PanicError.
func TestSetPoisonHeadersKeepsPanicStack(t *testing.T) {
	stack := "goroutine 7 [running]:\nmain.handle(...)\n\t/app/main.go:42 +0x1d\n"
	msg := message.NewMessage("m1", nil)
	err := fmt.Errorf("attempt 3: %w", &PanicError{Value: "nil map", Stack: stack})
	SetPoisonHeaders(msg, err, PoisonReasonExhausted, "q", time.Now())
	assert.Equal(t, stack, msg.Metadata.Get(PoisonStackKey))
	assert.Equal(t, "attempt 3: panic: nil map", msg.Metadata.Get(PoisonErrorKey))
	assert.Equal(t, "*middleware.PanicError", msg.Metadata.Get(PoisonErrorTypeKey))
}

// Error texts and stacks too long for a header are cut, with an ellipsis, and stay valid
// UTF-8; texts at the limit are kept whole.
func TestSetPoisonHeadersCutsLongTexts(t *testing.T) {
	long := strings.Repeat("x", maxErrorLen+100)
	msg := message.NewMessage("m1", nil)
	SetPoisonHeaders(msg, errors.New(long), PoisonReasonExhausted, "q", time.Now())
	assert.Equal(t, long[:maxErrorLen]+"…", msg.Metadata.Get(PoisonErrorKey))

	atLimit := strings.Repeat("y", maxErrorLen)
	SetPoisonHeaders(msg, errors.New(atLimit), PoisonReasonExhausted, "q", time.Now())
	assert.Equal(t, atLimit, msg.Metadata.Get(PoisonErrorKey))

	stack := strings.Repeat("s", maxStackLen*2)
	SetPoisonHeaders(msg, &PanicError{Value: 1, Stack: stack}, PoisonReasonExhausted, "q", time.Now())
	assert.Equal(t, stack[:maxStackLen]+"…", msg.Metadata.Get(PoisonStackKey))

	// A cut that would fall inside a multi-byte character falls before it.
	wide := "x" + strings.Repeat("é", maxErrorLen) // 'é' is 2 bytes: byte maxErrorLen is inside one
	SetPoisonHeaders(msg, errors.New(wide), PoisonReasonExhausted, "q", time.Now())
	got := msg.Metadata.Get(PoisonErrorKey)
	assert.True(t, utf8.ValidString(got), "invalid UTF-8 at the end: %q", got[len(got)-8:])
	assert.True(t, got == wide[:maxErrorLen-1]+"…", "cut at %d bytes, want %d", len(got)-len("…"), maxErrorLen-1)
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
		SetPoisonHeaders(msg, errors.New("boom"), PoisonReasonExhausted, "orders.q", time.Now())
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
		assert.Equal(t, "orders-handler", md.Get(PoisonHandlerKey))
	case <-time.After(10 * time.Second):
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
		warren.MetadataCorrelationID: "c", PoisonExpirationKey: "1"}
	SetPoisonHeaders(msg, errors.New("boom"), PoisonReasonExhausted, "q", time.Unix(0, 0))
	assert.NotContains(t, msg.Metadata, warren.MetadataExpiration)
	assert.Equal(t, "60000", msg.Metadata.Get(PoisonExpirationKey))
	assert.Equal(t, "9", msg.Metadata.Get(warren.MetadataPriority))
	assert.Equal(t, "c", msg.Metadata.Get(warren.MetadataCorrelationID))
	pub, err := warren.Marshaler{}.Marshal(msg)
	require.NoError(t, err)
	assert.Empty(t, pub.Expiration)

	msg = message.NewMessage("m2", nil)
	msg.Metadata.Set(PoisonExpirationKey, "1")
	SetPoisonHeaders(msg, errors.New("boom"), PoisonReasonExhausted, "q", time.Unix(0, 0))
	assert.NotContains(t, msg.Metadata, PoisonExpirationKey)
}
