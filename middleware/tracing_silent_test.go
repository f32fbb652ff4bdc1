package middleware_test

import (
	"fmt"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/warrenmq/warren/middleware"
)

// Without a provider that records, the trace context a message carries still reaches its
// handler, what the handler publishes, and the messages it returns.
func TestTracingSilentKeepsTraceContext(t *testing.T) {
	for name, tp := range map[string]trace.TracerProvider{"global": nil, "noop": noop.NewTracerProvider()} {
		t.Run(name, func(t *testing.T) {
			sdk, rec, _ := newTracing(t)
			pub := &recordingPublisher{}
			require.NoError(t, sdk.Publisher(pub).Publish("orders", message.NewMessage("id-1", nil)))
			sent := rec.Ended()[0].SpanContext()

			silent, err := middleware.NewTracing(middleware.TracingConfig{TracerProvider: tp})
			require.NoError(t, err)
			in := message.NewMessage("id-1", nil)
			for k, v := range pub.msgs[0].Metadata {
				in.Metadata.Set(k, v)
			}
			var inside trace.SpanContext
			out := message.NewMessage("out", nil)
			next := &recordingPublisher{}
			returned, err := silent.Middleware(func(msg *message.Message) ([]*message.Message, error) {
				inside = trace.SpanContextFromContext(msg.Context())
				retry := message.NewMessage("retry", nil)
				retry.SetContext(msg.Context())
				return []*message.Message{out}, silent.Publisher(next).Publish("orders.q", retry)
			})(in)
			require.NoError(t, err)
			assert.Equal(t, sent.TraceID(), inside.TraceID())
			assert.Equal(t, sent.SpanID(), inside.SpanID(), "no span of its own")
			assert.Equal(t, sent.TraceID(), trace.SpanContextFromContext(returned[0].Context()).TraceID())
			assert.Equal(t, pub.msgs[0].Metadata.Get("traceparent"), next.msgs[0].Metadata.Get("traceparent"))
			assert.Len(t, rec.Ended(), 1, "no span but the sender's")
		})
	}
}

// otel's global provider records nothing until one is set; from then on its spans are made.
func TestTracingGlobalProviderSetLater(t *testing.T) {
	if fmt.Sprintf("%T", otel.GetTracerProvider()) != "*global.tracerProvider" {
		t.Skip("the global provider was set already (an earlier run of this test)")
	}
	tr, err := middleware.NewTracing(middleware.TracingConfig{})
	require.NoError(t, err)
	handle := tr.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	_, err = handle(message.NewMessage("before", nil))
	require.NoError(t, err)

	rec := tracetest.NewSpanRecorder()
	otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)))
	t.Cleanup(func() { otel.SetTracerProvider(noop.NewTracerProvider()) })
	_, err = handle(message.NewMessage("after", nil))
	require.NoError(t, err)
	require.Len(t, rec.Ended(), 1)
	assert.Equal(t, "process unknown", rec.Ended()[0].Name())
}
