package dlx_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// withProperties returns a message with a metadata key of every AMQP property.
func withProperties(expiration string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":42}`))
	for k, v := range propertyMetadata(expiration) {
		msg.Metadata.Set(k, v)
	}
	return msg
}

func propertyMetadata(expiration string) message.Metadata {
	return message.Metadata{
		warren.MetadataContentType:     "application/json",
		warren.MetadataContentEncoding: "identity",
		warren.MetadataCorrelationID:   "corr-42",
		warren.MetadataReplyTo:         "replies",
		warren.MetadataType:            "order.created",
		warren.MetadataAppID:           "shop",
		warren.MetadataUserID:          "someoneelse",
		warren.MetadataTimestamp:       "2026-11-25T17:30:05Z",
		warren.MetadataPriority:        "9",
		warren.MetadataExpiration:      expiration,
		"tenant":                       "acme",
	}
}

// Published at once, every key is its property (user-id a header), and the metadata reads
// back the same.
func TestPublishImmediateSendsProperties(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("props")
	p := newPublisher(t, env, nil)
	require.NoError(t, p.Publish(q, withProperties("60000")))

	got := consume(t, env, q, 1)[0]
	d := got.d
	assert.Equal(t, "application/json", d.ContentType)
	assert.Equal(t, "identity", d.ContentEncoding)
	assert.Equal(t, "corr-42", d.CorrelationId)
	assert.Equal(t, "replies", d.ReplyTo)
	assert.Equal(t, "order.created", d.Type)
	assert.Equal(t, "shop", d.AppId)
	assert.Empty(t, d.UserId)
	assert.Equal(t, "someoneelse", d.Headers[warren.MetadataUserID])
	assert.Equal(t, time.Date(2026, 11, 25, 17, 30, 5, 0, time.UTC), d.Timestamp.UTC())
	assert.Equal(t, uint8(9), d.Priority)
	assert.Equal(t, "60000", d.Expiration)
	for k := range propertyMetadata("") {
		if k != warren.MetadataUserID && k != "tenant" {
			assert.NotContains(t, d.Headers, k)
		}
	}
	assert.Equal(t, propertyMetadata("60000"), got.msg.Metadata)
}

// Through the delay levels every property survives as metadata; the expiration and priority
// cross them as headers: a 1 ms expiration does not cut the wait short (the message is never
// early), and the destination gets them as metadata.
func TestEveryPropertySurvivesADelay(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.Queue("delayed")
	// Declared with the publisher, not by the Publish below: a declaration slower than the
	// delay (a loaded broker) would leave nothing to wait, and the message would go straight
	// to the queue with its 1 ms expiration (and expire there, into the poison queue).
	p := newPublisher(t, env, func(c *dlx.Config) { c.Declare = topology.Topology{Queues: []topology.Queue{{Name: q}}} })
	msg := withProperties("1")
	// Seconds: a delay whose time has come by the time a loaded machine sends the message
	// goes straight to the queue with its expiration (see docs/decisions.md, "dlx's tests
	// under load").
	delay := 3 * time.Second
	warren.Delay(msg, delay)
	start := time.Now()
	require.NoError(t, p.Publish(q, msg))

	got := consume(t, env, q, 1)[0]
	assert.False(t, got.at.Before(start.Add(delay)), "arrived %s early", start.Add(delay).Sub(got.at))
	assert.Equal(t, "application/json", got.d.ContentType)
	assert.Equal(t, "corr-42", got.d.CorrelationId)
	assert.Empty(t, got.d.Expiration)
	assert.Equal(t, "1", got.d.Headers[warren.MetadataExpiration])
	assert.Zero(t, got.d.Priority)
	assert.Equal(t, "9", got.d.Headers[warren.MetadataPriority])
	for k := range got.msg.Metadata {
		if strings.HasPrefix(k, "x-") { // x-death of the levels
			delete(got.msg.Metadata, k)
		}
	}
	assert.Equal(t, propertyMetadata("1"), got.msg.Metadata)
}
