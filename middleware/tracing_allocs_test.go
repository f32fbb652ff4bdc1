//go:build !race

package middleware_test

import (
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/warrenmq/warren/middleware"
)

// With no tracer installed, tracing a message that carries no trace context allocates
// nothing. (The race detector allocates of its own: not counted there.)
func TestTracingSilentAllocatesNothing(t *testing.T) {
	tr, err := middleware.NewTracing(middleware.TracingConfig{TracerProvider: noop.NewTracerProvider()})
	require.NoError(t, err)
	handle := tr.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	msg := message.NewMessage("id", []byte("payload"))
	assert.Zero(t, testing.AllocsPerRun(100, func() { _, _ = handle(msg) }))
}
