package amqpx

import (
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// MaxHeaderFrame is the largest content header frame payload warren publishes: frame_max
// (FrameSize) less the frame's 8 bytes, and 4 KiB left for the headers the broker adds to a
// message on its way (x-death and x-first/last-death-* when it is dead-lettered, about 200
// bytes per delay level queue it waited in; x-delivery-count on a quorum queue). A message
// that reached the limit without that room would be unreadable after them.
const MaxHeaderFrame = FrameSize - 8 - 4096

// HeaderFrameSize returns the payload size of the content header frame amqp091-go writes for
// p: class, weight, body size, flags and the properties, the header table included. An error
// says which header has a type amqp091-go cannot write.
func HeaderFrameSize(p amqp.Publishing) (int, error) {
	n := 14
	for _, s := range []string{p.ContentType, p.ContentEncoding, p.CorrelationId, p.ReplyTo,
		p.Expiration, p.MessageId, p.Type, p.UserId, p.AppId} {
		if s != "" {
			n += 1 + len(s)
		}
	}
	if p.DeliveryMode > 0 {
		n++
	}
	if p.Priority > 0 {
		n++
	}
	if !p.Timestamp.IsZero() {
		n += 8
	}
	if len(p.Headers) > 0 {
		t, err := tableSize(p.Headers)
		if err != nil {
			return 0, err
		}
		n += t
	}
	return n, nil
}

// tableSize is the encoded size of t, its length prefix included.
func tableSize(t amqp.Table) (int, error) {
	n := 4
	for k, v := range t {
		f, err := fieldSize(v)
		if err != nil {
			return 0, fmt.Errorf("header %q: %w", k, err)
		}
		n += 1 + len(k) + f
	}
	return n, nil
}

// fieldSize is the encoded size of a field value, its type octet included (amqp091-go's
// writeField).
func fieldSize(v any) (int, error) {
	switch v := v.(type) {
	case bool, byte, int8:
		return 2, nil
	case int16, uint16:
		return 3, nil
	case int, int32, uint32, float32:
		return 5, nil
	case int64, float64, time.Time:
		return 9, nil
	case amqp.Decimal:
		return 6, nil
	case string:
		return 5 + len(v), nil
	case []byte:
		return 5 + len(v), nil
	case nil:
		return 1, nil
	case amqp.Table:
		t, err := tableSize(v)
		return 1 + t, err
	case []any:
		n := 5
		for _, e := range v {
			f, err := fieldSize(e)
			if err != nil {
				return 0, err
			}
			n += f
		}
		return n, nil
	}
	return 0, fmt.Errorf("type %T cannot be sent", v)
}
