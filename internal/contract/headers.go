package contract

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TransportHeaderPrefix starts the names of warren's routing headers, which the DLX publisher
// sets on each publish and Unmarshal drops (see IsTransportHeader). The names deliberately do
// not start with "x-": a headers exchange ignores binding arguments that do.
const TransportHeaderPrefix = "warren-dlx-"

// PublishIDHeader carries the id the DLX publisher gives each message of a Publish call. It is
// the same on every copy of that publish (a re-send after a lost confirm, a redelivery after a
// lost ack) and new on every other publish (a replay, a new message): warren's subscriber
// recognises copies by it. A publish may ask for its id with warren.MetadataPublishID: warren derives
// the ids of retries and of a handler's outputs from the message they come from, so that
// copies of a message make copies of its retry and outputs, which are recognised in turn. A
// transport header: dropped on unmarshal, never published again.
const PublishIDHeader = TransportHeaderPrefix + "id"

// Transport headers of the delay levels (see topology.Delay), set by the DLX publisher.
const (
	// DestExchangeHeader names the exchange a delayed message is delivered to; the delivery
	// exchange routes by it.
	DestExchangeHeader = TransportHeaderPrefix + "exchange"
	// DestQueueHeader names the queue a delayed message is delivered to (through the default
	// exchange); the delivery exchange routes by it.
	DestQueueHeader = TransportHeaderPrefix + "queue"
	// DueHeader is when a delayed message is due, in microseconds since the Unix epoch (an
	// int64), by the publisher's clock: its consumer measures how late it arrived.
	DueHeader = TransportHeaderPrefix + "due"
)

// ReleasedHeader marks a message of a held order key that an operator released, moved back
// into its lane: it passes the key's hold (see package held).
const ReleasedHeader = TransportHeaderPrefix + "released"

// HeldMarkerHeader marks a message that a pass over a lane's held queue publishes into it:
// when it comes back, the pass has seen everything parked before it (see package held).
const HeldMarkerHeader = TransportHeaderPrefix + "held-marker"

// DigitHeader is the header that carries the digit of delay position p; the level exchange of
// position p routes by it.
func DigitHeader(p int) string { return TransportHeaderPrefix + "p" + strconv.Itoa(p) }

// IsTransportHeader reports whether the header is one of warren's own routing headers
// (delay digits, the delayed message's destination and due time, the publish id). They are
// set by the DLX publisher, never taken from metadata, and dropped on unmarshal.
func IsTransportHeader(name string) bool {
	return strings.HasPrefix(name, TransportHeaderPrefix)
}

// UnreadableHeader is the only header of a delivery whose headers the client library could
// not have read: the connection guard (amqpx.GuardConn) replaces the broker's header table
// with it, and its value says why. The body and the other properties are kept; warren's
// subscriber poisons such a delivery, and its poison copy keeps the header.
const UnreadableHeader = "warren-unreadable-headers"

// WatermillUUIDHeader is the header in which watermill-amqp, and warren's Marshaler, carry a
// message id longer than the message-id property holds.
const WatermillUUIDHeader = "_watermill_message_uuid"

// MaxExpiration is the largest per-message TTL (expiration property, in milliseconds) that
// RabbitMQ accepts: ten years. Larger values close the publishing channel (measured on
// RabbitMQ 3.10.8 and 4.0.5).
const MaxExpiration = 315_360_000_000

// ValidExpiration reports whether v can be published as the expiration property: a decimal
// integer (digits only) of at most MaxExpiration.
func ValidExpiration(v string) bool {
	if v == "" || len(v) > 20 {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] < '0' || v[i] > '9' {
			return false
		}
	}
	n, err := strconv.ParseUint(v, 10, 64)
	return err == nil && n <= MaxExpiration
}

// DeliveryID is the message id (Watermill's UUID) that d carries, as Unmarshal reads it: the
// message-id property, else watermill-amqp's _watermill_message_uuid header, where Marshal
// puts an id longer than the property holds.
func DeliveryID(d amqp.Delivery) string {
	if d.MessageId != "" {
		return d.MessageId
	}
	return HeaderString(d.Headers[WatermillUUIDHeader])
}

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

// ErrorType names the Go type of the innermost error of err's chain, as the poison record and
// warren's spans and metrics say it: "*json.SyntaxError", "*middleware.PanicError".
func ErrorType(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return fmt.Sprintf("%T", err)
		}
		err = next
	}
}
