package router

import (
	"context"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// traceID returns the hex id of the trace whose W3C trace context (traceparent) the headers h
// carry, as the router's tracing middleware would continue it; "" when they carry none. The
// poison copy of a delivery that never reached a handler records it, as one made by the
// Poison middleware does.
func traceID(h amqp.Table) string {
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), tableCarrier(h)))
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}

// tableCarrier is a read-only propagation.TextMapCarrier over a header table: a value that is
// not a string is no trace context.
type tableCarrier amqp.Table

var _ propagation.TextMapCarrier = tableCarrier(nil)

func (c tableCarrier) Get(key string) string {
	s, _ := c[key].(string)
	return s
}

func (c tableCarrier) Set(string, string) {}

func (c tableCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
