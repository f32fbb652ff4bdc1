package warren

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
)

// watermillUUIDHeader is where watermill-amqp's DefaultMarshaler keeps the message UUID.
// Marshaler reads it when a message has no AMQP message-id, so messages from plain
// watermill-amqp publishers keep their UUID.
const watermillUUIDHeader = "_watermill_message_uuid"

// Marshaler converts between Watermill messages and AMQP publishings and deliveries.
// It implements watermill-amqp's Marshaler, so it can be used in an amqp.Config too.
//
// Unlike watermill-amqp's DefaultMarshaler it never fails on headers the broker adds:
// every header value that is not a string is converted to one (integers and floats in
// decimal, booleans as "true"/"false", timestamps in RFC 3339, byte strings as base64, tables
// and arrays such as x-death as JSON). Metadata therefore always holds strings.
//
// The message UUID travels as the AMQP message-id property. Headers that RabbitMQ maintains
// for dead-lettering (x-death, x-first-death-*, x-last-death-*) and warren's transport
// headers are never published again: the broker stopped maintaining x-death for messages a
// client republishes (3.13/4.0), and below 4.0.1 a republished x-death can make the broker
// drop the message as a dead-letter cycle.
type Marshaler struct {
	// NotPersistent publishes with the transient delivery mode. The default is persistent.
	NotPersistent bool
}

// Marshal turns msg into a publishing: metadata become headers, the UUID the message-id.
func (m Marshaler) Marshal(msg *message.Message) (amqp.Publishing, error) {
	headers := make(amqp.Table, len(msg.Metadata))
	for k, v := range msg.Metadata {
		if IsBrokerHeader(k) || IsTransportHeader(k) {
			continue
		}
		headers[k] = v
	}
	p := amqp.Publishing{
		Headers:      headers,
		MessageId:    msg.UUID,
		Body:         msg.Payload,
		DeliveryMode: amqp.Persistent,
	}
	if m.NotPersistent {
		p.DeliveryMode = amqp.Transient
	}
	return p, nil
}

// Unmarshal turns a delivery into a message. It never fails: headers that are not strings
// are converted (see Marshaler). The UUID is the delivery's message-id, or
// watermill-amqp's UUID header when there is no message-id. warren's transport headers
// (those of the delay levels) and delay instructions (see IsDelayMetadata) are dropped.
func (m Marshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	uuid := d.MessageId
	msg := message.NewMessage("", d.Body)
	msg.Metadata = make(message.Metadata, len(d.Headers))
	for k, v := range d.Headers {
		if IsTransportHeader(k) || IsDelayMetadata(k) || k == MetadataPublishID {
			continue
		}
		if k == watermillUUIDHeader {
			if uuid == "" {
				uuid = HeaderString(v)
			}
			continue
		}
		msg.Metadata[k] = HeaderString(v)
	}
	msg.UUID = uuid
	return msg, nil
}

// IsBrokerHeader reports whether the header is one RabbitMQ maintains itself (dead-lettering
// history, the quorum delivery count). Such headers are read but never published again.
func IsBrokerHeader(name string) bool {
	return name == "x-delivery-count" ||
		strings.HasPrefix(name, "x-death") ||
		strings.HasPrefix(name, "x-first-death-") ||
		strings.HasPrefix(name, "x-last-death-")
}

// IsTransportHeader reports whether the header is one of warren's own routing headers
// (delay digits and the delayed message's destination). They are set by the DLX publisher,
// never taken from metadata, and dropped on unmarshal.
func IsTransportHeader(name string) bool {
	return strings.HasPrefix(name, TransportHeaderPrefix)
}

// Metadata keys of warren's delay API (dlx.MetadataDelay and dlx.MetadataDeliverAt).
const (
	MetadataDelay     = "warren_delay"      // a Go duration, relative to Publish
	MetadataDeliverAt = "warren_deliver_at" // an RFC 3339 time
)

// IsDelayMetadata reports whether the metadata key asks a publisher to delay the message:
// dlx's warren_delay and warren_deliver_at, and Watermill's components/delay keys. They are
// instructions to a publisher, not part of a message: a delivered message has been delayed
// already. Unmarshal drops them, so that a message forwarded as it was received goes at once,
// and a foreign value (a garbage duration, a time in the year 2999) never makes the forward
// fail.
func IsDelayMetadata(key string) bool {
	switch key {
	case MetadataDelay, MetadataDeliverAt, delay.DelayedForKey, delay.DelayedUntilKey:
		return true
	}
	return false
}

// TransportHeaderPrefix starts the names of warren's routing headers. The names deliberately
// do not start with "x-": a headers exchange ignores binding arguments that do.
const TransportHeaderPrefix = "warren-dlx-"

// PublishIDHeader carries the id the DLX publisher gives each message of a Publish call. It is
// the same on every copy of that publish (a re-send after a lost confirm, a redelivery after a
// lost ack) and new on every other publish (a replay, a new message): warren's subscriber
// recognises copies by it. A publish may ask for its id with MetadataPublishID: warren derives
// the ids of retries and of a handler's outputs from the message they come from, so that
// copies of a message make copies of its retry and outputs, which are recognised in turn. A
// transport header: dropped on unmarshal, never published again.
const PublishIDHeader = TransportHeaderPrefix + "id"

// MetadataPublishID asks the DLX publisher for the message's PublishIDHeader (instead of a new
// random one). It is an instruction to the publisher: consumed by Publish, never sent, and
// dropped on unmarshal.
const MetadataPublishID = "warren_publish_id"

// HeaderString converts an AMQP header value to the string kept in metadata.
func HeaderString(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case []byte:
		return base64.StdEncoding.EncodeToString(v)
	case bool:
		return strconv.FormatBool(v)
	case int8, int16, int32, int64, int, uint8, uint16, uint32, uint64, uint:
		return fmt.Sprint(v)
	case float32:
		return strconv.FormatFloat(float64(v), 'g', -1, 32)
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	case amqp.Decimal:
		return fmt.Sprintf("%de-%d", v.Value, v.Scale)
	default:
		b, err := json.Marshal(v) // tables and arrays: x-death

		if err != nil {
			return fmt.Sprint(v)
		}
		return string(b)
	}
}
