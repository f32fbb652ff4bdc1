package warren_test

import (
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
)

// allProperties is a delivery with every basic property set, and headers of the same names
// that the properties must win over.
func allProperties() amqp.Delivery {
	return amqp.Delivery{
		MessageId:       "m-1",
		ContentType:     "application/json",
		ContentEncoding: "gzip",
		CorrelationId:   "corr-1",
		ReplyTo:         "replies",
		Type:            "order.created",
		AppId:           "shop",
		UserId:          "guest",
		Timestamp:       time.Date(2026, 11, 25, 17, 30, 5, 0, time.UTC),
		Priority:        7,
		Expiration:      "60000",
		Body:            []byte("{}"),
		Headers: amqp.Table{
			warren.MetadataContentType: "text/plain", // the property wins
			warren.MetadataPriority:    "1",
			"tenant":                   "acme",
		},
	}
}

var wantMetadata = message.Metadata{
	warren.MetadataContentType:     "application/json",
	warren.MetadataContentEncoding: "gzip",
	warren.MetadataCorrelationID:   "corr-1",
	warren.MetadataReplyTo:         "replies",
	warren.MetadataType:            "order.created",
	warren.MetadataAppID:           "shop",
	warren.MetadataUserID:          "guest",
	warren.MetadataTimestamp:       "2026-11-25T17:30:05Z",
	warren.MetadataPriority:        "7",
	warren.MetadataExpiration:      "60000",
	"tenant":                       "acme",
}

func TestUnmarshalMapsEveryProperty(t *testing.T) {
	msg, err := warren.Marshaler{}.Unmarshal(allProperties())
	require.NoError(t, err)
	assert.Equal(t, wantMetadata, msg.Metadata)
}

// A header named like a key stands for its property when the property is absent (a message
// that crossed the delay levels, a poison copy), with its value converted to a string.
func TestUnmarshalReadsAKeyHeaderWhenThePropertyIsAbsent(t *testing.T) {
	msg, err := warren.Marshaler{}.Unmarshal(amqp.Delivery{Headers: amqp.Table{
		warren.MetadataExpiration: "5000", warren.MetadataUserID: "alice", warren.MetadataPriority: int32(9),
	}})
	require.NoError(t, err)
	assert.Equal(t, message.Metadata{warren.MetadataExpiration: "5000", warren.MetadataUserID: "alice",
		warren.MetadataPriority: "9"}, msg.Metadata)
}

func TestMarshalMapsEveryKeyBackToItsProperty(t *testing.T) {
	msg, err := warren.Marshaler{}.Unmarshal(allProperties())
	require.NoError(t, err)
	pub, err := warren.Marshaler{}.Marshal(msg)
	require.NoError(t, err)
	d := allProperties()
	assert.Equal(t, d.ContentType, pub.ContentType)
	assert.Equal(t, d.ContentEncoding, pub.ContentEncoding)
	assert.Equal(t, d.CorrelationId, pub.CorrelationId)
	assert.Equal(t, d.ReplyTo, pub.ReplyTo)
	assert.Equal(t, d.Type, pub.Type)
	assert.Equal(t, d.AppId, pub.AppId)
	assert.Equal(t, d.Timestamp, pub.Timestamp)
	assert.Equal(t, d.Priority, pub.Priority)
	assert.Equal(t, d.Expiration, pub.Expiration)
	assert.Equal(t, "m-1", pub.MessageId)
	assert.Empty(t, pub.UserId, "user-id is never the property")
	assert.Equal(t, amqp.Table{warren.MetadataUserID: "guest", "tenant": "acme"}, pub.Headers,
		"no key is also sent as a header, but user-id")
}

func TestMarshalTimestampInAnyZoneAndFraction(t *testing.T) {
	msg := message.NewMessage("u", nil)
	msg.Metadata.Set(warren.MetadataTimestamp, "2026-11-25T18:30:05.900+01:00")
	pub, err := warren.Marshaler{}.Marshal(msg)
	require.NoError(t, err)
	assert.Equal(t, time.Date(2026, 11, 25, 17, 30, 5, 0, time.UTC).Unix(), pub.Timestamp.Unix(), "whole seconds, as AMQP keeps them")
	assert.Empty(t, pub.Headers)
}

// hostile lists metadata values a property cannot take: Marshal publishes each as a header.
var hostile = []struct{ key, value string }{
	{warren.MetadataPriority, "abc"},
	{warren.MetadataPriority, "256"},
	{warren.MetadataPriority, "-1"},
	{warren.MetadataPriority, " 5"},
	{warren.MetadataTimestamp, "garbage"},
	{warren.MetadataTimestamp, "2026-11-25 17:30:05"},
	{warren.MetadataTimestamp, "0001-01-01T00:00:00Z"},
	{warren.MetadataExpiration, "abc"},
	{warren.MetadataExpiration, "-1"},
	{warren.MetadataExpiration, "+5"},
	{warren.MetadataExpiration, " 5"},
	{warren.MetadataExpiration, "1.5"},
	{warren.MetadataExpiration, "315360000001"},
	{warren.MetadataExpiration, "99999999999999999999999"},
	{warren.MetadataExpiration, "１２"},
	{warren.MetadataReplyTo, warren.DirectReplyTo},
	{warren.MetadataContentType, strings.Repeat("x", 256)},
	{warren.MetadataCorrelationID, strings.Repeat("é", 200)},
	{warren.MetadataUserID, "someoneelse"},
}

func TestMarshalPublishesWhatAPropertyCannotTakeAsAHeader(t *testing.T) {
	for _, h := range hostile {
		msg := message.NewMessage("u", nil)
		msg.Metadata.Set(h.key, h.value)
		pub, err := warren.Marshaler{}.Marshal(msg)
		require.NoError(t, err)
		assert.Equal(t, amqp.Table{h.key: h.value}, pub.Headers, "%s=%q", h.key, h.value)
		assert.Equal(t, amqp.Publishing{Headers: pub.Headers, MessageId: "u", DeliveryMode: amqp.Persistent}, pub,
			"%s=%q: no property", h.key, h.value)
		// and reads back as the same metadata
		back, err := warren.Marshaler{}.Unmarshal(amqp.Delivery{Headers: pub.Headers})
		require.NoError(t, err)
		assert.Equal(t, h.value, back.Metadata.Get(h.key))
	}
}

func TestMarshalEdgeValues(t *testing.T) {
	for _, c := range []struct {
		key, value string
		check      func(amqp.Publishing) bool
	}{
		{warren.MetadataExpiration, "0", func(p amqp.Publishing) bool { return p.Expiration == "0" }},
		{warren.MetadataExpiration, "315360000000", func(p amqp.Publishing) bool { return p.Expiration == "315360000000" }},
		{warren.MetadataPriority, "255", func(p amqp.Publishing) bool { return p.Priority == 255 }},
		{warren.MetadataPriority, "0", func(p amqp.Publishing) bool { return p.Priority == 0 }},
		{warren.MetadataReplyTo, warren.DirectReplyTo + ".g2dkAA", func(p amqp.Publishing) bool { return p.ReplyTo == warren.DirectReplyTo+".g2dkAA" }},
		{warren.MetadataContentType, strings.Repeat("x", 255), func(p amqp.Publishing) bool { return len(p.ContentType) == 255 }},
		{warren.MetadataContentType, "", func(p amqp.Publishing) bool { return p.ContentType == "" }},
		{warren.MetadataTimestamp, "1970-01-01T00:00:00Z", func(p amqp.Publishing) bool { return p.Timestamp.Unix() == 0 }},
	} {
		msg := message.NewMessage("u", nil)
		msg.Metadata.Set(c.key, c.value)
		pub, err := warren.Marshaler{}.Marshal(msg)
		require.NoError(t, err)
		assert.True(t, c.check(pub), "%s=%q: %+v", c.key, c.value, pub)
		assert.Empty(t, pub.Headers, "%s=%q", c.key, c.value)
	}
}

// A UUID too long for the message-id property travels in watermill-amqp's UUID header.
func TestMarshalLongUUID(t *testing.T) {
	id := strings.Repeat("u", 300)
	pub, err := warren.Marshaler{}.Marshal(message.NewMessage(id, nil))
	require.NoError(t, err)
	assert.Empty(t, pub.MessageId)
	back, err := warren.Marshaler{}.Unmarshal(amqp.Delivery{Headers: pub.Headers})
	require.NoError(t, err)
	assert.Equal(t, id, back.UUID)
}

// Every hostile value, marshaled, is a publish RabbitMQ takes (confirmed, channel open), on
// one confirm channel: a refusal would close it and fail the rest.
func TestBrokerTakesWhatMarshalMakesOfHostileValues(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ch := env.Channel()
	q := env.Name("hostile")
	env.Remove([]string{q}, nil)
	_, err := ch.QueueDeclare(q, false, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	all := message.NewMessage(strings.Repeat("u", 300), []byte("all"))
	for _, h := range hostile {
		msg := message.NewMessage("u", []byte(h.key+"="+h.value))
		msg.Metadata.Set(h.key, h.value)
		all.Metadata.Set(h.key, h.value)
		pub, err := warren.Marshaler{}.Marshal(msg)
		require.NoError(t, err)
		dc, err := ch.PublishWithDeferredConfirm("", q, true, false, pub)
		require.NoError(t, err, "%s=%q", h.key, h.value)
		require.True(t, dc.Wait(), "%s=%q nacked", h.key, h.value)
	}
	pub, err := warren.Marshaler{}.Marshal(all)
	require.NoError(t, err)
	dc, err := ch.PublishWithDeferredConfirm("", q, true, false, pub)
	require.NoError(t, err)
	require.True(t, dc.Wait())
	require.False(t, ch.IsClosed())
	assert.Equal(t, len(hostile)+1, func() int {
		n := 0
		require.Eventually(t, func() bool { n = env.Messages(q); return n == len(hostile)+1 }, testenv.Patience(), 20*time.Millisecond)
		return n
	}())
}

// What the broker delivers of a marshaled message with every property is the metadata again.
func TestPropertiesRoundTripThroughTheBroker(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ch := env.Channel()
	q := env.Name("roundtrip")
	env.Remove([]string{q}, nil)
	_, err := ch.QueueDeclare(q, false, false, false, false, nil)
	require.NoError(t, err)
	in, err := warren.Marshaler{}.Unmarshal(allProperties())
	require.NoError(t, err)
	pub, err := warren.Marshaler{}.Marshal(in)
	require.NoError(t, err)
	require.NoError(t, ch.Publish("", q, false, false, pub))
	d := get(t, ch, q)
	assert.Equal(t, "application/json", d.ContentType)
	assert.Equal(t, uint8(7), d.Priority)
	assert.Equal(t, "60000", d.Expiration)
	assert.Empty(t, d.UserId)
	out, err := warren.Marshaler{}.Unmarshal(d)
	require.NoError(t, err)
	assert.Equal(t, wantMetadata, out.Metadata)
}
