// Copyright (c) 2021 VMware, Inc. or its affiliates. All Rights Reserved.
// Copyright (c) 2012-2021, Sean Treadway, SoundCloud Ltd.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

package memrabbit

import (
	"encoding/binary"
	"errors"
	"io"
	"math"
	"time"
	"unsafe"
)

/*
ReadFrame reads a frame from an input stream and returns an interface that can be cast into
one of the following:

	methodFrame
	PropertiesFrame
	bodyFrame
	heartbeatFrame

2.3.5  frame Details

All frames consist of a header (7 octets), a payload of arbitrary size, and a
'frame-end' octet that detects malformed frames:

	0      1         3             7                  size+7 size+8
	+------+---------+-------------+  +------------+  +-----------+
	| type | channel |     size    |  |  payload   |  | frame-end |
	+------+---------+-------------+  +------------+  +-----------+
	 octet   short         long         size octets       octet

To read a frame, we:
 1. Read the header and check the frame type and channel.
 2. Depending on the frame type, we read the payload and process it.
 3. Read the frame end octet.

In realistic implementations where performance is a concern, we would use
“read-ahead buffering” or

“gathering reads” to avoid doing three separate system calls to read a frame.
*/
func (r *reader) ReadFrame() (frame frame, err error) {
	var scratch [7]byte

	if _, err = io.ReadFull(r.r, scratch[:7]); err != nil {
		return
	}

	typ := scratch[0]
	channel := binary.BigEndian.Uint16(scratch[1:3])
	size := binary.BigEndian.Uint32(scratch[3:7])

	if r.maxFrameSize != nil {
		// max-frameHeaderSize is safe from underflow only because maxFrameSize,
		// whenever nonzero, is always negotiateFrameSize's floor (frameMinSize,
		// 4096) or higher — see the Store call at Connection.openTune.
		if max := r.maxFrameSize.Load(); max > 0 && size > (max-frameHeaderSize) {
			return nil, ErrFrameTooLarge
		}
	}

	switch typ {
	case frameMethod:
		if frame, err = r.parseMethodFrame(channel, size); err != nil {
			return
		}

	case frameHeader:
		if frame, err = r.parseHeaderFrame(channel, size); err != nil {
			return
		}

	case frameBody:
		if frame, err = r.parseBodyFrame(channel, size); err != nil {
			return nil, err
		}

	case frameHeartbeat:
		if frame, err = r.parseHeartbeatFrame(channel, size); err != nil {
			return
		}

	default:
		return nil, ErrFrame
	}

	if _, err = io.ReadFull(r.r, scratch[:1]); err != nil {
		return nil, err
	}

	if scratch[0] != frameEnd {
		return nil, ErrFrame
	}

	return
}

// readAllocChunk caps how far readBytes allocates ahead of data confirmed
// present on the wire, so a fabricated length field cannot force a large
// allocation on its own.
const readAllocChunk = 64 * 1024

func min64(a, b int64) int64 {
	if a < b {
		return a
	}
	return b
}

// readBytes reads exactly n bytes, growing the buffer in readAllocChunk
// increments so it never allocates far ahead of confirmed data.
func readBytes(r io.Reader, n int64) ([]byte, error) {
	if n < 0 {
		return nil, ErrSyntax
	}

	buf := make([]byte, 0, min64(n, readAllocChunk))
	for int64(len(buf)) < n {
		chunk := int(min64(n-int64(len(buf)), readAllocChunk))
		old := len(buf)

		// append grows the backing array with Go's amortized (roughly
		// doubling) strategy, so repeated chunks don't each re-copy the
		// entire buffer read so far.
		buf = append(buf, make([]byte, chunk)...)

		if _, err := io.ReadFull(r, buf[old:]); err != nil {
			return nil, err
		}
	}
	return buf, nil
}

// cursor reads a frame's payload, read whole into the reader's buffer: what is read from it
// is copied out (strings, tables, byte arrays), as the buffer is the next frame's.
type cursor struct {
	b []byte
}

func (c *cursor) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.b)
	c.b = c.b[n:]
	return n, nil
}

// next takes the next n bytes.
func (c *cursor) next(n int) ([]byte, error) {
	if n < 0 || len(c.b) < n {
		c.b = nil
		return nil, io.ErrUnexpectedEOF
	}
	p := c.b[:n:n]
	c.b = c.b[n:]
	return p, nil
}

// payload reads a frame's payload of size bytes into the reader's buffer, growing it in
// readAllocChunk steps as the bytes arrive (a length the client claims does not allocate
// on its own).
func (r *reader) payload(size uint32) (*cursor, error) {
	buf := r.buf[:0]
	for uint32(len(buf)) < size {
		chunk := int(min(size-uint32(len(buf)), readAllocChunk))
		old := len(buf)
		buf = append(buf, make([]byte, chunk)...)
		if _, err := io.ReadFull(r.r, buf[old:]); err != nil {
			return nil, err
		}
	}
	r.buf = buf
	r.c.b = buf
	return &r.c, nil
}

// readBE reads an integer in network byte order.
func readBE[T uint8 | int8 | uint16 | int16 | uint32 | int32 | uint64 | int64](r io.Reader, v *T) error {
	c, ok := r.(*cursor)
	if !ok {
		return binary.Read(r, binary.BigEndian, v)
	}
	p, err := c.next(int(unsafe.Sizeof(*v)))
	if err != nil {
		return err
	}
	switch len(p) {
	case 1:
		*v = T(p[0])
	case 2:
		*v = T(binary.BigEndian.Uint16(p))
	case 4:
		*v = T(binary.BigEndian.Uint32(p))
	default:
		*v = T(binary.BigEndian.Uint64(p))
	}
	return nil
}

func readShortstr(r io.Reader) (v string, err error) {
	if c, ok := r.(*cursor); ok {
		return c.shortstr()
	}
	var length uint8
	if err = binary.Read(r, binary.BigEndian, &length); err != nil {
		return
	}

	bytes, err := readBytes(r, int64(length))
	if err != nil {
		return
	}
	return string(bytes), nil
}

func readLongstr(r io.Reader) (v string, err error) {
	if c, ok := r.(*cursor); ok {
		return c.longstr()
	}
	var length uint32
	if err = binary.Read(r, binary.BigEndian, &length); err != nil {
		return
	}

	// slices can't be longer than max int32 value
	if length > (^uint32(0) >> 1) {
		return "", ErrSyntax
	}

	bytes, err := readBytes(r, int64(length))
	if err != nil {
		return
	}
	return string(bytes), nil
}

func (c *cursor) shortstr() (string, error) {
	n, err := c.next(1)
	if err != nil {
		return "", err
	}
	p, err := c.next(int(n[0]))
	return string(p), err
}

func (c *cursor) longstr() (string, error) {
	p, err := c.sized()
	return string(p), err
}

// sized takes what a length of four bytes prefixes.
func (c *cursor) sized() ([]byte, error) {
	n, err := c.next(4)
	if err != nil {
		return nil, err
	}
	length := binary.BigEndian.Uint32(n)
	// slices can't be longer than max int32 value
	if length > (^uint32(0) >> 1) {
		return nil, ErrSyntax
	}
	return c.next(int(length))
}

/*
'A': any
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
// Tables and arrays are read to any depth and length: RabbitMQ takes whatever fits its frame
// (measured: a table 33 deep, 8,193 headers, an array of 8,193, where amqp091-go reads 32 and
// 8,192), and the frame's size bounds them.
func (c *cursor) field() (any, error) {
	t, err := c.next(1)
	if err != nil {
		return nil, err
	}
	fixed := func(n int) []byte {
		if err == nil {
			var p []byte
			p, err = c.next(n)
			return p
		}
		return nil
	}

	switch t[0] {
	case 't':
		p := fixed(1)
		if err != nil {
			return nil, err
		}
		return p[0] != 0, nil

	case 'B':
		p := fixed(1)
		if err != nil {
			return nil, err
		}
		return p[0], nil

	case 'b':
		p := fixed(1)
		if err != nil {
			return nil, err
		}
		return int8(p[0]), nil

	case 's':
		p := fixed(2)
		if err != nil {
			return nil, err
		}
		return int16(binary.BigEndian.Uint16(p)), nil

	case 'I':
		p := fixed(4)
		if err != nil {
			return nil, err
		}
		return int32(binary.BigEndian.Uint32(p)), nil

	case 'l':
		p := fixed(8)
		if err != nil {
			return nil, err
		}
		return int64(binary.BigEndian.Uint64(p)), nil

	case 'u':
		p := fixed(2)
		if err != nil {
			return nil, err
		}
		return binary.BigEndian.Uint16(p), nil

	case 'i':
		p := fixed(4)
		if err != nil {
			return nil, err
		}
		return binary.BigEndian.Uint32(p), nil

	case 'f':
		p := fixed(4)
		if err != nil {
			return nil, err
		}
		return math.Float32frombits(binary.BigEndian.Uint32(p)), nil

	case 'd':
		p := fixed(8)
		if err != nil {
			return nil, err
		}
		return math.Float64frombits(binary.BigEndian.Uint64(p)), nil

	case 'D':
		p := fixed(5)
		if err != nil {
			return nil, err
		}
		return Decimal{Scale: p[0], Value: int32(binary.BigEndian.Uint32(p[1:]))}, nil

	case 'S':
		return c.longstr()

	case 'A':
		return c.array()

	case 'T':
		p := fixed(8)
		if err != nil {
			return nil, err
		}
		return time.Unix(int64(binary.BigEndian.Uint64(p)), 0), nil

	case 'F':
		return c.table()

	case 'x':
		p := fixed(4)
		if err != nil {
			return nil, err
		}
		n := int32(binary.BigEndian.Uint32(p))
		if n < 0 {
			return nil, ErrSyntax
		}
		p = fixed(int(n))
		if err != nil {
			return nil, err
		}
		return append([]byte{}, p...), nil

	case 'V':
		return nil, nil
	}

	return nil, ErrSyntax
}

/*
Field tables are long strings that contain packed name-value pairs.  The
name-value pairs are encoded as short string defining the name, and octet
defining the values type and then the value itself.   The valid field types for
tables are an extension of the native integer, bit, string, and timestamp
types, and are shown in the grammar.  Multi-octet integer fields are always
held in network byte order.
*/
func readTable(r io.Reader) (table Table, err error) {
	if c, ok := r.(*cursor); ok {
		return c.table()
	}
	s, err := readLongstr(r)
	if err != nil {
		return nil, err
	}
	return parseTable([]byte(s))
}

func (c *cursor) table() (Table, error) {
	p, err := c.sized()
	if err != nil {
		return nil, err
	}
	return parseTable(p)
}

// parseTable parses a table's entries, p.
func parseTable(p []byte) (Table, error) {
	nested := cursor{b: p}
	table := make(Table)
	for len(nested.b) > 0 {
		key, err := nested.shortstr()
		if err != nil {
			return nil, err
		}
		value, err := nested.field()
		if err != nil {
			return nil, err
		}
		table[key] = value
	}
	return table, nil
}

func (c *cursor) array() ([]any, error) {
	p, err := c.sized()
	if err != nil {
		return nil, err
	}
	nested := cursor{b: p}
	var arr []any
	for len(nested.b) > 0 {
		field, err := nested.field()
		if err != nil {
			return nil, err
		}
		arr = append(arr, field)
	}
	return arr, nil
}

// Checks if this bit mask matches the flags bitset
func hasProperty(mask uint16, prop int) bool {
	return int(mask)&prop > 0
}

func (r *reader) parseHeaderFrame(channel uint16, size uint32) (frame frame, err error) {
	hf := &headerFrame{
		ChannelId: channel,
	}

	c, err := r.payload(size)
	if err != nil {
		return
	}

	if err = readBE(c, &hf.ClassId); err != nil {
		return
	}

	if err = readBE(c, &hf.weight); err != nil {
		return
	}

	if err = readBE(c, &hf.Size); err != nil {
		return
	}

	var flags uint16

	if err = readBE(c, &flags); err != nil {
		return
	}

	shortstr := func(flag int, s *string) {
		if err == nil && hasProperty(flags, flag) {
			*s, err = c.shortstr()
		}
	}
	p := &hf.Properties
	shortstr(flagContentType, &p.ContentType)
	shortstr(flagContentEncoding, &p.ContentEncoding)
	if err == nil && hasProperty(flags, flagHeaders) {
		p.Headers, err = c.table()
	}
	if err == nil && hasProperty(flags, flagDeliveryMode) {
		err = readBE(c, &p.DeliveryMode)
	}
	if err == nil && hasProperty(flags, flagPriority) {
		err = readBE(c, &p.Priority)
	}
	shortstr(flagCorrelationId, &p.CorrelationId)
	shortstr(flagReplyTo, &p.ReplyTo)
	shortstr(flagExpiration, &p.Expiration)
	shortstr(flagMessageId, &p.MessageId)
	if err == nil && hasProperty(flags, flagTimestamp) {
		var sec int64
		if err = readBE(c, &sec); err == nil {
			p.Timestamp = time.Unix(sec, 0)
		}
	}
	shortstr(flagType, &p.Type)
	shortstr(flagUserId, &p.UserId)
	shortstr(flagAppId, &p.AppId)
	shortstr(flagReserved1, &p.reserved1)
	if err != nil {
		return nil, err
	}

	// Bytes remaining in the payload that property parsing did not consume (e.g.
	// padding added by other AMQP implementations) are ignored.
	return hf, nil
}

func (r *reader) parseBodyFrame(channel uint16, size uint32) (frame frame, err error) {
	bf := &bodyFrame{
		ChannelId: channel,
	}

	c, err := r.payload(size)
	if err != nil {
		return nil, err
	}
	bf.Body = c.b // the reader's buffer: the channel copies it before the next frame is read

	return bf, nil
}

var errHeartbeatPayload = errors.New("heartbeats should not have a payload")
var errHeartbeatChannel = errors.New("heartbeats must be sent on channel 0")

func (r *reader) parseHeartbeatFrame(channel uint16, size uint32) (frame frame, err error) {
	// Per the AMQP 0-9-1 spec, heartbeats are only ever sent on channel 0.
	if channel != 0 {
		return nil, errHeartbeatChannel
	}

	hf := &heartbeatFrame{
		ChannelId: channel,
	}

	if size > 0 {
		return nil, errHeartbeatPayload
	}

	return hf, nil
}
