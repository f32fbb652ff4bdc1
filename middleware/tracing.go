package middleware

import (
	"context"
	"reflect"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
)

// Attributes of warren's own, next to the messaging semantic conventions.
const (
	attemptAttr = attribute.Key("warren.attempt")
	delayAttr   = attribute.Key("warren.delay")
)

const tracerName = "github.com/warrenmq/warren/middleware"

// TracingConfig configures Tracing. The zero value is usable.
type TracingConfig struct {
	// TracerProvider creates the spans. Default: otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// Propagator carries the trace context in message metadata. Default:
	// propagation.TraceContext{} (W3C traceparent and tracestate).
	Propagator propagation.TextMapPropagator
}

// WithDefaults returns c with every unset field set to its default.
func (c TracingConfig) WithDefaults() TracingConfig {
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	return c
}

// Tracing traces messages with OpenTelemetry, following the messaging semantic conventions:
// a producer span for every message published through Publisher, a consumer span around
// every message processed by Middleware. The trace context travels in the message metadata,
// so one trace follows a message through publish, delay levels, retries and poisoning,
// across processes.
//
// With a provider that records nothing (a noop.TracerProvider, or otel's global provider
// while no other is set with otel.SetTracerProvider) no span is made: the trace context the
// metadata carries still goes into the message's context and on into what is published, at
// no allocation.
type Tracing struct {
	tracer     trace.Tracer
	provider   trace.TracerProvider
	silent     bool // provider records nothing
	global     bool // provider is otel's default global one: silent until another is set
	propagator propagation.TextMapPropagator
	fields     []string // the propagator's Fields, which a composite one builds on every call
}

// NewTracing creates a Tracing from config; any config is valid. The error is always nil,
// and there for the day a field can be invalid.
func NewTracing(config TracingConfig) (*Tracing, error) {
	config = config.WithDefaults()
	tp := config.TracerProvider
	_, silent := tp.(noop.TracerProvider)
	return &Tracing{
		tracer:     tp.Tracer(tracerName, trace.WithSchemaURL(semconv.SchemaURL)),
		provider:   tp,
		silent:     silent,
		global:     reflect.TypeOf(tp).String() == defaultGlobalType,
		propagator: config.Propagator,
		fields:     config.Propagator.Fields(),
	}, nil
}

// defaultGlobalType is the type of otel's default global TracerProvider, which makes spans
// that record nothing until otel.SetTracerProvider gives it a delegate (otel.GetTracerProvider
// then returns that one). Should otel rename it, every provider is taken as recording.
const defaultGlobalType = "*global.tracerProvider"

// records reports whether the spans of t's tracer may record.
func (t *Tracing) records() bool {
	if t.global {
		return otel.GetTracerProvider() != t.provider
	}
	return !t.silent
}

// Middleware is a plain message.HandlerMiddleware: a consumer span around processing.
//
// The span continues the trace found in the message metadata and is put in the message's
// context before the handler runs, so that messages published with that context (retries,
// poison messages, anything the handler sends) are traced as its children. A handler error
// or panic marks the span as failed; the panic goes on.
func (t *Tracing) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		if !t.records() {
			return t.untraced(h, msg)
		}
		return t.traced(h, msg)
	}
}

// untraced runs h without a span, in the trace context that msg's metadata carries, if any:
// the messages the handler returns without a trace of their own, and what it publishes in
// msg's context, continue that trace.
func (t *Tracing) untraced(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	msg.SetContext(t.propagator.Extract(msg.Context(), propagation.MapCarrier(msg.Metadata)))
	msgs, err := h(msg)
	continueTrace(msgs, trace.SpanFromContext(msg.Context()))
	return msgs, err
}

// continueTrace puts span in the context of each of msgs that has no trace of its own: the
// messages a handler returns continue the trace of the message it handled.
func continueTrace(msgs []*message.Message, span trace.Span) {
	if !span.SpanContext().IsValid() {
		return
	}
	for _, out := range msgs {
		if !trace.SpanContextFromContext(out.Context()).IsValid() {
			out.SetContext(trace.ContextWithSpan(out.Context(), span))
		}
	}
}

// traced runs h inside a consumer span.
func (t *Tracing) traced(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	destination := "unknown"
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemRabbitMQ,
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"),
	}
	d, _ := warren.DeliveryFrom(msg.Context())
	if d.Queue != "" {
		destination = d.Queue
	} else if topic := message.SubscribeTopicFromCtx(msg.Context()); topic != "" {
		destination = topic
	}
	if d.RoutingKey != "" {
		attrs = append(attrs, semconv.MessagingRabbitMQDestinationRoutingKey(d.RoutingKey))
	}
	attrs = append(attrs,
		semconv.MessagingDestinationName(destination),
		semconv.MessagingMessageID(msg.UUID),
		semconv.MessagingMessageBodySize(len(msg.Payload)),
		attemptAttr.Int(Attempt(msg)),
	)

	ctx := t.propagator.Extract(msg.Context(), propagation.MapCarrier(msg.Metadata))
	ctx, span := t.tracer.Start(ctx, "process "+destination,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithAttributes(attrs...))
	msg.SetContext(ctx)

	defer func() {
		if r := recover(); r != nil {
			setError(span, &PanicError{Value: r})
			span.End()
			panic(r)
		}
		span.End()
	}()
	msgs, err := h(msg)
	if err != nil {
		setError(span, err)
	}
	continueTrace(msgs, span)
	return msgs, err
}

// Publisher decorates pub: a producer span per message, trace context injected into metadata.
//
// The span of a message is a child of the span in the message's context, if any. Its
// context replaces whatever trace context the metadata held: a retry carries the headers of
// the message it was copied from.
func (t *Tracing) Publisher(pub message.Publisher) message.Publisher {
	return &tracingPublisher{t: t, pub: pub}
}

// PublisherDecorator is Publisher as a Watermill message.PublisherDecorator (for
// Router.AddPublisherDecorators).
func (t *Tracing) PublisherDecorator() message.PublisherDecorator {
	return func(pub message.Publisher) (message.Publisher, error) {
		return t.Publisher(pub), nil
	}
}

type tracingPublisher struct {
	t   *Tracing
	pub message.Publisher
}

func (p *tracingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if !p.t.records() {
		for _, msg := range msgs {
			p.inject(msg.Context(), msg)
		}
		return p.pub.Publish(topic, msgs...)
	}
	spans := make([]trace.Span, len(msgs))
	for i, msg := range msgs {
		attrs := []attribute.KeyValue{
			semconv.MessagingSystemRabbitMQ,
			semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName("send"),
			semconv.MessagingDestinationName(topic),
			semconv.MessagingMessageID(msg.UUID),
			semconv.MessagingMessageBodySize(len(msg.Payload)),
		}
		if _, ok := msg.Metadata[warren.AttemptKey]; ok {
			// From the metadata, not Attempt: a retry keeps the context, and so the attempt
			// number, of the message it was copied from.
			attrs = append(attrs, attemptAttr.Int(readAttempt(msg)))
		}
		if d, ok := msg.Metadata[warren.MetadataDelay]; ok {
			attrs = append(attrs, delayAttr.String(d))
		}
		ctx, span := p.t.tracer.Start(msg.Context(), "send "+topic,
			trace.WithSpanKind(trace.SpanKindProducer), trace.WithAttributes(attrs...))
		spans[i] = span
		p.inject(ctx, msg)
	}

	err := p.pub.Publish(topic, msgs...)
	for _, span := range spans {
		if err != nil {
			setError(span, err)
		}
		span.End()
	}
	return err
}

// inject replaces the trace context in msg's metadata with ctx's.
func (p *tracingPublisher) inject(ctx context.Context, msg *message.Message) {
	if msg.Metadata == nil {
		msg.Metadata = message.Metadata{}
	}
	for _, field := range p.t.fields {
		delete(msg.Metadata, field)
	}
	p.t.propagator.Inject(ctx, propagation.MapCarrier(msg.Metadata))
}

func (p *tracingPublisher) Close() error { return p.pub.Close() }

// TraceID returns the hex trace id of the span in msg's context, or "" when there is none.
func TraceID(msg *message.Message) string {
	sc := trace.SpanContextFromContext(msg.Context())
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}

// setError marks span as failed by err. error.type names the innermost error of err's
// chain, as the poison headers do.
func setError(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	span.SetAttributes(semconv.ErrorTypeKey.String(contract.ErrorType(err)))
}
