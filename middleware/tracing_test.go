package middleware_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/middleware"
)

// recordingPublisher keeps what is published to it and fails with err.
type recordingPublisher struct {
	topics []string
	msgs   []*message.Message
	calls  int
	closed bool
	err    error
}

func (p *recordingPublisher) Publish(topic string, msgs ...*message.Message) error {
	p.calls++
	for _, m := range msgs {
		p.topics = append(p.topics, topic)
		p.msgs = append(p.msgs, m)
	}
	return p.err
}

func (p *recordingPublisher) Close() error { p.closed = true; return nil }

func newTracing(t *testing.T) (*middleware.Tracing, *tracetest.SpanRecorder, trace.Tracer) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr, err := middleware.NewTracing(middleware.TracingConfig{TracerProvider: tp})
	require.NoError(t, err)
	return tr, rec, tp.Tracer("test")
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func spanNamed(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			require.Nil(t, found, "two spans named %q", name)
			found = s
		}
	}
	require.NotNil(t, found, "no span named %q", name)
	return found
}

func TestTracingPublisherStartsProducerSpan(t *testing.T) {
	tr, rec, tracer := newTracing(t)
	ctx, parent := tracer.Start(context.Background(), "parent")

	pub := &recordingPublisher{}
	decorated, err := tr.PublisherDecorator()(pub)
	require.NoError(t, err)

	m1 := message.NewMessage("id-1", []byte("hello"))
	m1.SetContext(ctx)
	m1.Metadata.Set(warren.AttemptKey, "2")
	warren.Delay(m1, 1500*time.Millisecond)
	m1.Metadata.Set("traceparent", "00-0123456789abcdef0123456789abcdef-0123456789abcdef-01") // stale
	m1.Metadata.Set("tracestate", "stale=1")
	m2 := message.NewMessage("id-2", nil)
	m2.SetContext(ctx)
	require.NoError(t, decorated.Publish("orders", m1, m2))
	parent.End()

	assert.Equal(t, 1, pub.calls, "one Publish for all messages")
	require.Len(t, pub.msgs, 2)

	sends := rec.Ended()[:2]
	for i, s := range sends {
		assert.Equal(t, "send orders", s.Name())
		assert.Equal(t, trace.SpanKindProducer, s.SpanKind())
		assert.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID())
		assert.Equal(t, parent.SpanContext().TraceID(), s.SpanContext().TraceID())
		md := pub.msgs[i].Metadata
		assert.Equal(t, "00-"+s.SpanContext().TraceID().String()+"-"+s.SpanContext().SpanID().String()+"-01", md.Get("traceparent"))
		assert.Empty(t, md.Get("tracestate"), "stale tracestate removed")
	}

	a := attrs(sends[0])
	assert.Equal(t, "rabbitmq", a["messaging.system"].AsString())
	assert.Equal(t, "send", a["messaging.operation.type"].AsString())
	assert.Equal(t, "send", a["messaging.operation.name"].AsString())
	assert.Equal(t, "orders", a["messaging.destination.name"].AsString())
	assert.Equal(t, "id-1", a["messaging.message.id"].AsString())
	assert.Equal(t, int64(5), a["messaging.message.body.size"].AsInt64())
	assert.Equal(t, int64(2), a["warren.attempt"].AsInt64())
	assert.Equal(t, "1.5s", a["warren.delay"].AsString())

	a = attrs(sends[1])
	assert.NotContains(t, a, attribute.Key("warren.attempt"))
	assert.NotContains(t, a, attribute.Key("warren.delay"))

	require.NoError(t, decorated.Close())
	assert.True(t, pub.closed)
}

func TestTracingPublisherRecordsPublishError(t *testing.T) {
	tr, rec, _ := newTracing(t)
	pub := &recordingPublisher{err: errors.New("broker gone")}

	err := tr.Publisher(pub).Publish("orders", message.NewMessage("a", nil), message.NewMessage("b", nil))
	require.ErrorIs(t, err, pub.err)

	require.Len(t, rec.Ended(), 2)
	for _, s := range rec.Ended() {
		assert.Equal(t, codes.Error, s.Status().Code)
		assert.Equal(t, "broker gone", s.Status().Description)
		require.Len(t, s.Events(), 1)
		assert.Equal(t, "exception", s.Events()[0].Name)
	}
}

func TestTracingMiddlewareContinuesTrace(t *testing.T) {
	tr, rec, _ := newTracing(t)
	pub := &recordingPublisher{}
	out := message.NewMessage("id-1", []byte("payload"))
	require.NoError(t, tr.Publisher(pub).Publish("orders", out))
	send := rec.Ended()[0]

	// What the subscriber hands over: the headers, and where the message came from.
	in := message.NewMessage("id-1", []byte("payload"))
	for k, v := range pub.msgs[0].Metadata {
		in.Metadata.Set(k, v)
	}
	in.Metadata.Set(warren.AttemptKey, "3")
	in.SetContext(contract.WithDelivery(context.Background(), contract.Delivery{
		Queue: "orders.q", Exchange: "orders", RoutingKey: "order.created",
	}))

	var inside trace.SpanContext
	_, err := tr.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		inside = trace.SpanContextFromContext(msg.Context())
		return nil, nil
	})(in)
	require.NoError(t, err)

	process := spanNamed(t, rec, "process orders.q")
	assert.Equal(t, trace.SpanKindConsumer, process.SpanKind())
	assert.Equal(t, send.SpanContext().TraceID(), process.SpanContext().TraceID())
	assert.Equal(t, send.SpanContext().SpanID(), process.Parent().SpanID())
	assert.True(t, process.Parent().IsRemote())
	assert.Equal(t, process.SpanContext(), inside, "the handler runs in the consumer span")
	assert.Equal(t, codes.Unset, process.Status().Code)

	a := attrs(process)
	assert.Equal(t, "rabbitmq", a["messaging.system"].AsString())
	assert.Equal(t, "process", a["messaging.operation.type"].AsString())
	assert.Equal(t, "process", a["messaging.operation.name"].AsString())
	assert.Equal(t, "orders.q", a["messaging.destination.name"].AsString())
	assert.Equal(t, "order.created", a["messaging.rabbitmq.destination.routing_key"].AsString())
	assert.Equal(t, "id-1", a["messaging.message.id"].AsString())
	assert.Equal(t, int64(7), a["messaging.message.body.size"].AsInt64())
	assert.Equal(t, int64(3), a["warren.attempt"].AsInt64())
}

func TestTracingMiddlewareWithoutDeliveryOrTraceContext(t *testing.T) {
	tr, rec, _ := newTracing(t)
	_, err := tr.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(message.NewMessage("x", nil))
	require.NoError(t, err)

	process := spanNamed(t, rec, "process unknown")
	assert.False(t, process.Parent().IsValid(), "a new trace")
	a := attrs(process)
	assert.Equal(t, "unknown", a["messaging.destination.name"].AsString())
	assert.NotContains(t, a, attribute.Key("messaging.rabbitmq.destination.routing_key"))
	assert.Equal(t, int64(1), a["warren.attempt"].AsInt64())
}

// publish → process → republish (as a retry does) → process: one trace, each span the
// parent of the next.
func TestTracingChainSharesTrace(t *testing.T) {
	tr, rec, _ := newTracing(t)
	pub := &recordingPublisher{}
	publisher := tr.Publisher(pub)
	consume := func(h message.HandlerFunc) {
		t.Helper()
		sent := pub.msgs[len(pub.msgs)-1]
		in := message.NewMessage(sent.UUID, sent.Payload)
		for k, v := range sent.Metadata {
			in.Metadata.Set(k, v)
		}
		in.SetContext(contract.WithDelivery(context.Background(), contract.Delivery{Queue: "work"}))
		_, err := tr.Middleware(h)(in)
		require.NoError(t, err)
	}

	require.NoError(t, publisher.Publish("work", message.NewMessage("id-1", []byte("job"))))
	consume(func(msg *message.Message) ([]*message.Message, error) {
		retry := msg.Copy() // carries the consumed traceparent
		retry.SetContext(msg.Context())
		retry.Metadata.Set(warren.AttemptKey, "2")
		return nil, publisher.Publish("work", retry)
	})
	consume(func(*message.Message) ([]*message.Message, error) { return nil, nil })

	spans := rec.Ended()
	require.Len(t, spans, 4)
	// Ended order: send, send (retry, inside the first process), process, process.
	send1, send2, process1, process2 := spans[0], spans[1], spans[2], spans[3]
	assert.Equal(t, []string{"send work", "send work", "process work", "process work"},
		[]string{send1.Name(), send2.Name(), process1.Name(), process2.Name()})
	for _, s := range spans {
		assert.Equal(t, send1.SpanContext().TraceID(), s.SpanContext().TraceID())
	}
	assert.Equal(t, send1.SpanContext().SpanID(), process1.Parent().SpanID())
	assert.Equal(t, process1.SpanContext().SpanID(), send2.Parent().SpanID())
	assert.Equal(t, send2.SpanContext().SpanID(), process2.Parent().SpanID())
	assert.Equal(t, int64(2), attrs(send2)["warren.attempt"].AsInt64())
	assert.Equal(t, int64(2), attrs(process2)["warren.attempt"].AsInt64())
}

func TestTracingMiddlewareHandlerError(t *testing.T) {
	tr, rec, _ := newTracing(t)
	want := warren.Permanent(errors.New("bad payload"))

	_, err := tr.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, want })(message.NewMessage("x", nil))
	require.Equal(t, want, err)

	process := spanNamed(t, rec, "process unknown")
	assert.Equal(t, codes.Error, process.Status().Code)
	assert.Equal(t, want.Error(), process.Status().Description)
	assert.Equal(t, "*errors.errorString", attrs(process)["error.type"].AsString())
	require.Len(t, process.Events(), 1)
	assert.Equal(t, "exception", process.Events()[0].Name)
}

func TestTracingMiddlewareHandlerPanic(t *testing.T) {
	tr, rec, _ := newTracing(t)
	h := tr.Middleware(func(*message.Message) ([]*message.Message, error) { panic("boom") })

	assert.PanicsWithValue(t, "boom", func() { _, _ = h(message.NewMessage("x", nil)) })

	process := spanNamed(t, rec, "process unknown")
	assert.Equal(t, codes.Error, process.Status().Code)
	assert.Equal(t, "panic: boom", process.Status().Description)
	assert.Equal(t, "*middleware.PanicError", attrs(process)["error.type"].AsString())
}

func TestTraceID(t *testing.T) {
	tr, rec, _ := newTracing(t)
	msg := message.NewMessage("x", nil)
	assert.Equal(t, "", middleware.TraceID(msg))

	var id string
	_, err := tr.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		id = middleware.TraceID(msg)
		return nil, nil
	})(msg)
	require.NoError(t, err)
	assert.Equal(t, rec.Ended()[0].SpanContext().TraceID().String(), id)
	assert.Len(t, id, 32)
}

func TestTracingZeroConfig(t *testing.T) {
	c := middleware.TracingConfig{}.WithDefaults()
	assert.NotNil(t, c.TracerProvider)
	assert.NotNil(t, c.Propagator)
	tr, err := middleware.NewTracing(middleware.TracingConfig{})
	require.NoError(t, err)
	// The global provider is a no-op by default: nothing is traced, nothing breaks.
	pub := &recordingPublisher{}
	require.NoError(t, tr.Publisher(pub).Publish("t", message.NewMessage("x", nil)))
	_, err = tr.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })(pub.msgs[0])
	require.NoError(t, err)
}
