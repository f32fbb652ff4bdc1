// Copyright (c) 2021 VMware, Inc. or its affiliates. All Rights Reserved.
// Copyright (c) 2012-2021, Sean Treadway, SoundCloud Ltd.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

package memrabbit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
)

// frameBuffer is where frames are encoded, one after the other, for one write to the
// connection: each frame, and each table in it, is appended in place, its size written once
// its end is known.
type frameBuffer struct {
	b []byte
}

func (fb *frameBuffer) Write(p []byte) (int, error) {
	fb.b = append(fb.b, p...)
	return len(p), nil
}

func (fb *frameBuffer) WriteString(s string) (int, error) {
	fb.b = append(fb.b, s...)
	return len(s), nil
}

func (fb *frameBuffer) WriteByte(c byte) error {
	fb.b = append(fb.b, c)
	return nil
}

// begin starts a frame: its header is written by end, once the payload's size is known.
func (fb *frameBuffer) begin() int {
	start := len(fb.b)
	fb.b = append(fb.b, 0, 0, 0, 0, 0, 0, 0)
	return start
}

// end ends the frame begun at start: its type, channel and payload size, then frame-end.
// After an error the frame is taken out of the buffer.
func (fb *frameBuffer) end(start int, typ uint8, channel uint16, err error) error {
	if err != nil {
		fb.b = fb.b[:start]
		return err
	}
	fb.b[start] = typ
	binary.BigEndian.PutUint16(fb.b[start+1:], channel)
	binary.BigEndian.PutUint32(fb.b[start+3:], uint32(len(fb.b)-start-7))
	fb.b = append(fb.b, frameEnd)
	return nil
}

func (f *methodFrame) write(fb *frameBuffer) error {
	if f.Method == nil {
		return errors.New("malformed frame: missing method")
	}
	start := fb.begin()
	class, method := f.Method.id()
	fb.b = binary.BigEndian.AppendUint16(fb.b, class)
	fb.b = binary.BigEndian.AppendUint16(fb.b, method)
	return fb.end(start, frameMethod, f.ChannelId, f.Method.write(fb))
}

// Heartbeat
//
// Payload is empty
func (f *heartbeatFrame) write(fb *frameBuffer) error {
	return fb.end(fb.begin(), frameHeartbeat, f.ChannelId, nil)
}

// CONTENT HEADER
// 0          2        4           12               14
// +----------+--------+-----------+----------------+------------- - -
// | class-id | weight | body size | property flags | property list...
// +----------+--------+-----------+----------------+------------- - -
//
//	short     short    long long       short        remainder...
func (f *headerFrame) write(fb *frameBuffer) error {
	start := fb.begin()
	var err error
	fb.b, err = f.appendPayload(fb.b)
	return fb.end(start, frameHeader, f.ChannelId, err)
}

func (f *headerFrame) appendPayload(b []byte) ([]byte, error) {
	b = binary.BigEndian.AppendUint16(b, f.ClassId)
	b = binary.BigEndian.AppendUint16(b, f.weight)
	b = binary.BigEndian.AppendUint64(b, f.Size)

	// First pass will build the mask to be serialized, second pass will serialize
	// each of the fields that appear in the mask.

	p := &f.Properties
	var mask uint16

	if p.ContentType != "" {
		mask |= flagContentType
	}
	if p.ContentEncoding != "" {
		mask |= flagContentEncoding
	}
	if len(p.Headers) > 0 || len(p.deaths) > 0 {
		mask |= flagHeaders
	}
	if p.DeliveryMode > 0 {
		mask |= flagDeliveryMode
	}
	if p.Priority > 0 {
		mask |= flagPriority
	}
	if p.CorrelationId != "" {
		mask |= flagCorrelationId
	}
	if p.ReplyTo != "" {
		mask |= flagReplyTo
	}
	if p.Expiration != "" {
		mask |= flagExpiration
	}
	if p.MessageId != "" {
		mask |= flagMessageId
	}
	if !p.Timestamp.IsZero() {
		mask |= flagTimestamp
	}
	if p.Type != "" {
		mask |= flagType
	}
	if p.UserId != "" {
		mask |= flagUserId
	}
	if p.AppId != "" {
		mask |= flagAppId
	}

	b = binary.BigEndian.AppendUint16(b, mask)

	var err error
	shortstr := func(flag int, s string) {
		if err == nil && hasProperty(mask, flag) {
			b, err = appendShortstr(b, s)
		}
	}
	shortstr(flagContentType, p.ContentType)
	shortstr(flagContentEncoding, p.ContentEncoding)
	if err == nil && hasProperty(mask, flagHeaders) {
		b, err = appendHeaders(b, p.Headers, p.deaths)
	}
	if hasProperty(mask, flagDeliveryMode) {
		b = append(b, p.DeliveryMode)
	}
	if hasProperty(mask, flagPriority) {
		b = append(b, p.Priority)
	}
	shortstr(flagCorrelationId, p.CorrelationId)
	shortstr(flagReplyTo, p.ReplyTo)
	shortstr(flagExpiration, p.Expiration)
	shortstr(flagMessageId, p.MessageId)
	if hasProperty(mask, flagTimestamp) {
		b = binary.BigEndian.AppendUint64(b, uint64(p.Timestamp.Unix()))
	}
	shortstr(flagType, p.Type)
	shortstr(flagUserId, p.UserId)
	shortstr(flagAppId, p.AppId)
	return b, err
}

// Body
//
// Payload is one byterange from the full body who's size is declared in the
// Header frame
func (f *bodyFrame) write(fb *frameBuffer) error {
	start := fb.begin()
	fb.b = append(fb.b, f.Body...)
	return fb.end(start, frameBody, f.ChannelId, nil)
}

func appendShortstr(b []byte, s string) ([]byte, error) {
	if len(s) > 255 {
		return b, fmt.Errorf("amqp: shortstr %q exceeds 255 bytes", s)
	}
	b = append(b, uint8(len(s)))
	return append(b, s...), nil
}

// The methods of the spec write only into the connection's frameBuffer (methodFrame.write):
// writeShortstr, writeLongstr and writeTable append to it in place.

func writeShortstr(w io.Writer, s string) (err error) {
	fb := w.(*frameBuffer)
	fb.b, err = appendShortstr(fb.b, s)
	return err
}

func writeLongstr(w io.Writer, s string) error {
	fb := w.(*frameBuffer)
	fb.b = binary.BigEndian.AppendUint32(fb.b, uint32(len(s)))
	fb.b = append(fb.b, s...)
	return nil
}

// sized appends, through add, what is prefixed by its size in four bytes: the size is
// written once add has appended it.
func sized(b []byte, add func([]byte) ([]byte, error)) ([]byte, error) {
	at := len(b)
	b = append(b, 0, 0, 0, 0)
	b, err := add(b)
	binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-4))
	return b, err
}

/*
'A': []any
'D': Decimal
'F': Table
'I': int32
'S': string
'T': time.Time
'V': nil
'b': int8
'B': byte
'd': float64
'f': float32
'l': int64
'i': uint32
's': int16
'u': uint16
't': bool
'x': []byte
*/
func appendField(b []byte, value any) ([]byte, error) {
	switch v := value.(type) {
	case bool:
		if v {
			return append(b, 't', 1), nil
		}
		return append(b, 't', 0), nil

	case byte:
		return append(b, 'B', v), nil

	case int8:
		return append(b, 'b', uint8(v)), nil

	case int16:
		return binary.BigEndian.AppendUint16(append(b, 's'), uint16(v)), nil

	case int:
		return binary.BigEndian.AppendUint32(append(b, 'I'), uint32(v)), nil

	case int32:
		return binary.BigEndian.AppendUint32(append(b, 'I'), uint32(v)), nil

	case int64:
		return binary.BigEndian.AppendUint64(append(b, 'l'), uint64(v)), nil

	case uint16:
		return binary.BigEndian.AppendUint16(append(b, 'u'), v), nil

	case uint32:
		return binary.BigEndian.AppendUint32(append(b, 'i'), v), nil

	case float32:
		return binary.BigEndian.AppendUint32(append(b, 'f'), math.Float32bits(v)), nil

	case float64:
		return binary.BigEndian.AppendUint64(append(b, 'd'), math.Float64bits(v)), nil

	case Decimal:
		return binary.BigEndian.AppendUint32(append(b, 'D', v.Scale), uint32(v.Value)), nil

	case string:
		b = binary.BigEndian.AppendUint32(append(b, 'S'), uint32(len(v)))
		return append(b, v...), nil

	case []any: // field-array
		return sized(append(b, 'A'), func(b []byte) ([]byte, error) {
			var err error
			for _, val := range v {
				if b, err = appendField(b, val); err != nil {
					return b, err
				}
			}
			return b, nil
		})

	case time.Time:
		return binary.BigEndian.AppendUint64(append(b, 'T'), uint64(v.Unix())), nil

	case Table:
		return appendTable(append(b, 'F'), v)

	case []byte:
		b = binary.BigEndian.AppendUint32(append(b, 'x'), uint32(len(v)))
		return append(b, v...), nil

	case nil:
		return append(b, 'V'), nil
	}
	return b, ErrFieldType
}

// appendTable appends a Table: its size, then each key and value.
func appendTable(b []byte, table Table) ([]byte, error) {
	return sized(b, func(b []byte) ([]byte, error) {
		var err error
		for key, val := range table {
			if b, err = appendEntry(b, key, val); err != nil {
				return b, err
			}
		}
		return b, nil
	})
}

// appendHeaders appends a message's headers as one table: over's, and those of headers
// that over does not have.
func appendHeaders(b []byte, headers, over Table) ([]byte, error) {
	if len(over) == 0 {
		return appendTable(b, headers)
	}
	return sized(b, func(b []byte) ([]byte, error) {
		var err error
		for key, val := range headers {
			if _, ok := over[key]; ok {
				continue
			}
			if b, err = appendEntry(b, key, val); err != nil {
				return b, err
			}
		}
		for key, val := range over {
			if b, err = appendEntry(b, key, val); err != nil {
				return b, err
			}
		}
		return b, nil
	})
}

// appendEntry appends a table's entry.
func appendEntry(b []byte, key string, val any) ([]byte, error) {
	b, err := appendShortstr(b, key)
	if err != nil {
		return b, fmt.Errorf("writing key %q: %w", key, err)
	}
	if b, err = appendField(b, val); err != nil {
		return b, fmt.Errorf("writing value for key %q: %w", key, err)
	}
	return b, nil
}

// writeTable serializes a Table to the given writer.
func writeTable(w io.Writer, table Table) (err error) {
	fb := w.(*frameBuffer)
	fb.b, err = appendTable(fb.b, table)
	return err
}
