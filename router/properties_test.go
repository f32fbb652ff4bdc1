package router_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/consumer"
	"github.com/warrenmq/warren/internal/testenv"
)

// The poison copy of a delivery the marshaler cannot unmarshal keeps every property; the
// user-id goes to its header and the expiration to the poison header (the copy never
// expires).
func TestUndecodablePoisonCopyKeepsProperties(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("undecodable-props")
	subscribe(t, env, queue, consumer.Config{Marshaler: pickyMarshaler{}, HandlerName: "picky"})

	publishRaw(t, env, "", queue, withEveryProperty(amqp.Table{"encoding": "rot13"}))
	d := poisoned(t, env, queue, testenv.Patience())
	assert.Equal(t, warren.PoisonReasonUndecoded, d.Headers[warren.PoisonReasonKey])
	assertPoisonCopyProperties(t, d)
}

// So does the poison copy of a delivery whose headers the client cannot read (the guard
// replaces the table, the properties after it in the frame are kept).
func TestUnreadablePoisonCopyKeepsProperties(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("unreadable-props")
	subscribe(t, env, queue, consumer.Config{HandlerName: "h"})
	publishRaw(t, env, "", queue, withEveryProperty(amqp.Table{"deep": testenv.NestedTable(33)}))
	d := poisoned(t, env, queue, testenv.Patience())
	assert.Equal(t, warren.PoisonReasonUnreadable, d.Headers[warren.PoisonReasonKey])
	assertPoisonCopyProperties(t, d)
}

var propertiesAt = time.Date(2026, 11, 25, 17, 30, 5, 0, time.UTC)

// withEveryProperty returns a publishing with every basic property and headers h.
func withEveryProperty(h amqp.Table) amqp.Publishing {
	return amqp.Publishing{
		MessageId: "bad", Body: []byte("x"), Headers: h, DeliveryMode: amqp.Persistent,
		ContentType: "text/plain", ContentEncoding: "rot13", CorrelationId: "corr-1", ReplyTo: "replies",
		Type: "t", AppId: "app", UserId: "guest", Timestamp: propertiesAt, Priority: 3, Expiration: "600000",
	}
}

func assertPoisonCopyProperties(t *testing.T, d amqp.Delivery) {
	t.Helper()
	assert.Equal(t, "bad", d.MessageId)
	assert.Equal(t, "text/plain", d.ContentType)
	assert.Equal(t, "rot13", d.ContentEncoding)
	assert.Equal(t, "corr-1", d.CorrelationId)
	assert.Equal(t, "replies", d.ReplyTo)
	assert.Equal(t, "t", d.Type)
	assert.Equal(t, "app", d.AppId)
	assert.Equal(t, propertiesAt, d.Timestamp.UTC())
	assert.Equal(t, uint8(3), d.Priority)
	assert.Empty(t, d.Expiration)
	assert.Equal(t, "600000", d.Headers[warren.PoisonExpirationKey])
	assert.Empty(t, d.UserId)
	assert.Equal(t, "guest", d.Headers[warren.MetadataUserID])
}
