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
// Poison middleware does. A header that is not a string is no trace context.
func traceID(h amqp.Table) string {
	tc := propagation.TraceContext{}
	carrier := propagation.MapCarrier{}
	for _, k := range tc.Fields() {
		if s, ok := h[k].(string); ok {
			carrier[k] = s
		}
	}
	sc := trace.SpanContextFromContext(tc.Extract(context.Background(), carrier))
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}
