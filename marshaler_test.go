package warren_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
)

var _ wamqp.Marshaler = warren.Marshaler{}

func TestUnmarshalConvertsEveryHeaderType(t *testing.T) {
	ts := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	d := amqp.Delivery{
		MessageId: "id-1",
		Body:      []byte("body"),
		Headers: amqp.Table{
			"s":                "text",
			"x-delivery-count": int64(3),
			"i32":              int32(-7),
			"b":                true,
			"f":                1.5,
			"bytes":            []byte{1, 2},
			"ts":               ts,
			"x-death": []any{amqp.Table{
				"count": int64(2), "queue": "orders", "reason": "rejected", "time": ts,
				"routing-keys": []any{"orders"},
			}},
			"x-first-death-queue":     "orders",
			"warren-dlx-p0":           "3",
			"_watermill_message_uuid": "ignored: message-id wins",
		},
	}
	msg, err := warren.Marshaler{}.Unmarshal(d)
	require.NoError(t, err)
	assert.Equal(t, "id-1", msg.UUID)
	assert.Equal(t, "body", string(msg.Payload))
	assert.Equal(t, "text", msg.Metadata.Get("s"))
	assert.Equal(t, "3", msg.Metadata.Get("x-delivery-count"))
	assert.Equal(t, "-7", msg.Metadata.Get("i32"))
	assert.Equal(t, "true", msg.Metadata.Get("b"))
	assert.Equal(t, "1.5", msg.Metadata.Get("f"))
	assert.Equal(t, "AQI=", msg.Metadata.Get("bytes"))
	assert.Equal(t, "2026-11-22T10:00:00Z", msg.Metadata.Get("ts"))
	assert.NotContains(t, msg.Metadata, "warren-dlx-p0", "transport headers are dropped")
	assert.NotContains(t, msg.Metadata, "_watermill_message_uuid")

	var deaths []map[string]any
	require.NoError(t, json.Unmarshal([]byte(msg.Metadata.Get("x-death")), &deaths))
	assert.Equal(t, "orders", deaths[0]["queue"])
	assert.EqualValues(t, 2, deaths[0]["count"])

	// Published again: no x-death*, no broker counters, metadata as strings, UUID as message-id.
	pub, err := warren.Marshaler{}.Marshal(msg)
	require.NoError(t, err)
	assert.Equal(t, "id-1", pub.MessageId)
	assert.Equal(t, uint8(amqp.Persistent), pub.DeliveryMode)
	for _, k := range []string{"x-death", "x-first-death-queue", "x-delivery-count"} {
		assert.NotContains(t, pub.Headers, k)
	}
	assert.Equal(t, "3", msg.Metadata.Get("x-delivery-count"), "the message itself is not changed")
	assert.Equal(t, "text", pub.Headers["s"])
	assert.Equal(t, "-7", pub.Headers["i32"])
}

func TestUnmarshalReadsWatermillUUIDHeader(t *testing.T) {
	msg, err := warren.Marshaler{}.Unmarshal(amqp.Delivery{Headers: amqp.Table{"_watermill_message_uuid": "wm-1"}})
	require.NoError(t, err)
	assert.Equal(t, "wm-1", msg.UUID)
	assert.Empty(t, msg.Metadata)
}

func TestMarshalNotPersistent(t *testing.T) {
	pub, err := warren.Marshaler{NotPersistent: true}.Marshal(message.NewMessage("u", nil))
	require.NoError(t, err)
	assert.Equal(t, uint8(amqp.Transient), pub.DeliveryMode)
}

// A message the broker really dead-lettered (x-death, x-first-death-*) round-trips through the
// marshaler, where watermill-amqp's DefaultMarshaler fails; republished, it carries no x-death.
func TestRoundTripThroughRealDeadLettering(t *testing.T) {
	env := testenv.New(t)
	ch := env.Channel()
	src, dst := env.Name("src"), env.Name("dst")
	env.Remove([]string{src, dst}, nil)
	_, err := ch.QueueDeclare(dst, false, false, false, false, nil)
	require.NoError(t, err)
	_, err = ch.QueueDeclare(src, false, false, false, false, amqp.Table{
		"x-message-ttl": int64(0), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": dst,
	})
	require.NoError(t, err)

	in := message.NewMessage("rt-1", []byte("payload"))
	in.Metadata.Set("tenant", "acme")
	pub, err := warren.Marshaler{}.Marshal(in)
	require.NoError(t, err)
	pub.Headers["count"] = int32(42) // an integer header, as another client may send
	require.NoError(t, ch.Publish("", src, false, false, pub))

	d := get(t, ch, dst)
	require.Contains(t, d.Headers, "x-death")
	_, err = wamqp.DefaultMarshaler{}.Unmarshal(d)
	require.Error(t, err, "watermill-amqp's marshaler fails on x-death")

	msg, err := warren.Marshaler{}.Unmarshal(d)
	require.NoError(t, err)
	assert.Equal(t, "rt-1", msg.UUID)
	assert.Equal(t, "acme", msg.Metadata.Get("tenant"))
	assert.Equal(t, "42", msg.Metadata.Get("count"))
	assert.Contains(t, msg.Metadata.Get("x-death"), src)
	assert.Equal(t, src, msg.Metadata.Get("x-first-death-queue"))

	again, err := warren.Marshaler{}.Marshal(msg)
	require.NoError(t, err)
	require.NoError(t, ch.Publish("", dst, false, false, again))
	d2 := get(t, ch, dst)
	for k := range d2.Headers {
		assert.False(t, k == "x-death" || k == "x-delivery-count" || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-"), "republished broker header %s", k)
	}
	assert.Equal(t, "rt-1", d2.MessageId)
	assert.Equal(t, "42", d2.Headers["count"])
}

func get(t *testing.T, ch *amqp.Channel, queue string) amqp.Delivery {
	t.Helper()
	var (
		d   amqp.Delivery
		err error
	)
	require.Eventually(t, func() bool {
		var ok bool
		d, ok, err = ch.Get(queue, true)
		return ok || err != nil
	}, testenv.Patience(), 20*time.Millisecond, "nothing arrived in %s", queue)
	require.NoError(t, err)
	return d
}

// Delay instructions are not part of a delivered message: foreign or stale ones are dropped,
// so a handler that forwards what it received sends it at once and never fails on them.
func TestUnmarshalDropsDelayInstructions(t *testing.T) {
	msg, err := warren.Marshaler{}.Unmarshal(amqp.Delivery{MessageId: "m", Headers: amqp.Table{
		warren.MetadataDelay:     "garbage",
		warren.MetadataDeliverAt: "2001-01-01T00:00:00Z",
		delay.DelayedUntilKey:    "2999-01-01T00:00:00Z",
		delay.DelayedForKey:      "1s",
		"order":                  "42",
	}})
	require.NoError(t, err)
	assert.Equal(t, message.Metadata{"order": "42"}, msg.Metadata)
}
