package router_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
)

// The poison copy of a delivery the marshaler cannot unmarshal keeps every property; the
// user-id goes to its header and the expiration to the poison header (the copy never
// expires).
func TestUndecodablePoisonCopyKeepsProperties(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("undecodable-props")
	subscribe(t, env, queue, router.SubscriberConfig{Marshaler: pickyMarshaler{}, HandlerName: "picky"})

	ts := time.Date(2026, 11, 25, 17, 30, 5, 0, time.UTC)
	require.NoError(t, env.Channel().Publish("", queue, false, false, amqp.Publishing{
		MessageId: "bad", Body: []byte("x"), Headers: amqp.Table{"encoding": "rot13"},
		ContentType: "text/plain", ContentEncoding: "rot13", CorrelationId: "corr-1", ReplyTo: "replies",
		Type: "t", AppId: "app", UserId: "guest", Timestamp: ts, Priority: 3, Expiration: "600000",
	}))
	d := poisoned(t, env, queue, 10*time.Second)
	assert.Equal(t, middleware.PoisonReasonUndecoded, d.Headers[middleware.PoisonReasonKey])
	assert.Equal(t, "text/plain", d.ContentType)
	assert.Equal(t, "rot13", d.ContentEncoding)
	assert.Equal(t, "corr-1", d.CorrelationId)
	assert.Equal(t, "replies", d.ReplyTo)
	assert.Equal(t, "t", d.Type)
	assert.Equal(t, "app", d.AppId)
	assert.Equal(t, ts, d.Timestamp.UTC())
	assert.Equal(t, uint8(3), d.Priority)
	assert.Empty(t, d.Expiration)
	assert.Equal(t, "600000", d.Headers[middleware.PoisonExpirationKey])
	assert.Empty(t, d.UserId)
	assert.Equal(t, "guest", d.Headers[warren.MetadataUserID])
}
