package warren

import (
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/warrenmq/warren/internal/contract"
)

// Marshaler converts between Watermill messages and AMQP publishings and deliveries.
// It implements watermill-amqp's Marshaler, so it can be used in an amqp.Config too.
//
// Unlike watermill-amqp's DefaultMarshaler it never fails on headers the broker adds:
// every header value that is not a string is converted to one (integers and floats in
// decimal, booleans as "true"/"false", timestamps in RFC 3339, byte strings as base64, tables
// and arrays such as x-death as JSON). Metadata therefore always holds strings.
//
// The message UUID travels as the AMQP message-id property (as watermill-amqp's
// _watermill_message_uuid header when it is longer than the 255 bytes a property holds).
// Headers that RabbitMQ maintains for dead-lettering (x-death, x-first-death-*,
// x-last-death-*) and warren's transport headers are never published again: the broker
// stopped maintaining x-death for messages a client republishes (3.13/4.0), and below 4.0.1 a
// republished x-death can make the broker drop the message as a dead-letter cycle.
//
// # AMQP properties
//
// The basic properties of a delivery become metadata, and go back to properties when the
// message is published, so that they survive handlers, retries, delays, the poison queue and
// a replay, and foreign clients see real properties:
//
//	content-type      MetadataContentType      amqp_content_type
//	content-encoding  MetadataContentEncoding  amqp_content_encoding
//	correlation-id    MetadataCorrelationID    amqp_correlation_id
//	reply-to          MetadataReplyTo          amqp_reply_to
//	type              MetadataType             amqp_type
//	app-id            MetadataAppID            amqp_app_id
//	user-id           MetadataUserID           amqp_user_id (published as a header only)
//	timestamp         MetadataTimestamp        amqp_timestamp, RFC 3339 in whole seconds (UTC)
//	priority          MetadataPriority         amqp_priority, 1–255 in decimal
//	expiration        MetadataExpiration       amqp_expiration, milliseconds in decimal
//
// Unmarshal reads a header of the same name as a key only when the property is absent: the
// property wins. Marshal sends a key as its property and not also as a header.
//
// Marshal never fails and never builds a publish the broker refuses, so that no value a
// message brings (a foreign client's, a hostile one) can make a retry or poison copy fail
// for ever. A value the property cannot take is published as a header of the key's name
// instead, which Unmarshal reads back into the same metadata: a timestamp that is not RFC 3339
// (or is the zero time), a priority that is not an integer in 0–255, an expiration that is
// not a decimal integer of at most 315,360,000,000 ms (ten years: RabbitMQ 3.10.8 and 4.0.5
// close the channel with 406 PRECONDITION_FAILED "invalid expiration" on "abc", "-1", " 5",
// "1.5" or 315360000001, measured), a string longer than 255 bytes (amqp091-go cannot write
// it and closes the whole connection), and the reply-to "amq.rabbitmq.reply-to" (direct
// reply-to: RabbitMQ refuses it with 406 "fast reply consumer does not exist" unless the
// publishing channel consumes from it, which Marshal cannot know; the address a server
// receives, amq.rabbitmq.reply-to.<encoded>, is a property as any other). Empty values are
// not sent; a priority of 0 is not sent either (amqp091-go does not write one: it is the
// same as none).
//
// user-id is read from the property but published only as the header amqp_user_id, never as
// the property: RabbitMQ refuses a publish whose user-id is not the connection's user (406
// PRECONDITION_FAILED "user_id property set to 'someoneelse' but authenticated user was
// 'guest'", channel closed, measured on 3.10.8 and 4.0.5), so a retry or poison copy of
// another user's message would fail for ever. The header is not checked by the broker: unlike
// the property, amqp_user_id read from a header says what the publisher claims, not who it
// is.
//
// expiration is a per-message TTL. It counts again from each publish (a retry published
// without delay may expire in its work queue, and then reaches its poison queue as
// dead-lettered by the broker). The DLX publisher carries it (and the priority) in a header
// through the delay levels, where it would cut the wait short, and the poison middleware
// keeps it in a poison header (PoisonExpirationKey) so that a poison copy never
// expires; a replay restores the property.
type Marshaler struct {
	// NotPersistent publishes with the transient delivery mode. The default is persistent.
	NotPersistent bool
}

// maxShortString is the longest string an AMQP short string (every string property) holds.
const maxShortString = 255

// DirectReplyTo is RabbitMQ's direct reply-to pseudo-queue. A publish with it as reply-to is
// refused unless the publishing channel consumes from it.
const DirectReplyTo = "amq.rabbitmq.reply-to"

// Marshal turns msg into a publishing: metadata become headers, the AMQP property keys
// properties (see Marshaler), the UUID the message-id. It never fails.
func (m Marshaler) Marshal(msg *message.Message) (amqp.Publishing, error) {
	headers := make(amqp.Table, len(msg.Metadata))
	p := amqp.Publishing{
		Headers:      headers,
		MessageId:    msg.UUID,
		Body:         msg.Payload,
		DeliveryMode: amqp.Persistent,
	}
	for k, v := range msg.Metadata {
		if isBrokerHeader(k) || contract.IsTransportHeader(k) || setProperty(&p, k, v) {
			continue
		}
		headers[k] = v
	}
	if len(msg.UUID) > maxShortString {
		p.MessageId = ""
		headers[contract.WatermillUUIDHeader] = msg.UUID
	}
	if m.NotPersistent {
		p.DeliveryMode = amqp.Transient
	}
	return p, nil
}

// setProperty sets the property of metadata key k to v and reports true, or reports false
// when k is no property's key or v is a value the property cannot take (k is then a header).
func setProperty(p *amqp.Publishing, k, v string) bool {
	var field *string
	switch k {
	case MetadataContentType:
		field = &p.ContentType
	case MetadataContentEncoding:
		field = &p.ContentEncoding
	case MetadataCorrelationID:
		field = &p.CorrelationId
	case MetadataReplyTo:
		if v == DirectReplyTo {
			return false
		}
		field = &p.ReplyTo
	case MetadataType:
		field = &p.Type
	case MetadataAppID:
		field = &p.AppId
	case MetadataExpiration:
		if v != "" && !contract.ValidExpiration(v) {
			return false
		}
		field = &p.Expiration
	case MetadataTimestamp:
		if v == "" {
			return true
		}
		t, err := time.Parse(time.RFC3339, v)
		if err != nil || t.IsZero() {
			return false
		}
		p.Timestamp = t
		return true
	case MetadataPriority:
		if v == "" {
			return true
		}
		n, err := strconv.ParseUint(v, 10, 8)
		if err != nil {
			return false
		}
		p.Priority = uint8(n)
		return true
	default: // MetadataUserID too: see Marshaler
		return false
	}
	if len(v) > maxShortString {
		return false
	}
	*field = v
	return true
}

// Unmarshal turns a delivery into a message. It never fails: headers that are not strings
// are converted (see Marshaler). The UUID is the delivery's message-id, or
// watermill-amqp's UUID header when there is no message-id. The AMQP properties become
// metadata (see Marshaler), in place of the headers of the same names. warren's transport
// headers (those of the delay levels) and delay instructions (see IsDelayMetadata) are
// dropped.
func (m Marshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	msg := message.NewMessage(contract.DeliveryID(d), d.Body)
	msg.Metadata = make(message.Metadata, len(d.Headers)+4)
	for k, v := range d.Headers {
		if contract.IsTransportHeader(k) || IsDelayMetadata(k) || k == MetadataPublishID || k == contract.WatermillUUIDHeader {
			continue
		}
		msg.Metadata[k] = contract.HeaderString(v)
	}
	for _, p := range [...]struct{ key, value string }{
		{MetadataContentType, d.ContentType},
		{MetadataContentEncoding, d.ContentEncoding},
		{MetadataCorrelationID, d.CorrelationId},
		{MetadataReplyTo, d.ReplyTo},
		{MetadataType, d.Type},
		{MetadataAppID, d.AppId},
		{MetadataUserID, d.UserId},
		{MetadataExpiration, d.Expiration},
	} {
		if p.value != "" {
			msg.Metadata[p.key] = p.value
		}
	}
	if !d.Timestamp.IsZero() {
		msg.Metadata[MetadataTimestamp] = d.Timestamp.UTC().Format(time.RFC3339)
	}
	if d.Priority > 0 {
		msg.Metadata[MetadataPriority] = strconv.Itoa(int(d.Priority))
	}
	return msg, nil
}
