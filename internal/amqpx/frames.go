package amqpx

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"

	"github.com/warrenmq/warren/internal/contract"
)

// Limits of amqp091-go's frame reader (read.go): beyond them it fails the whole connection.
const (
	maxFieldDepth        = 32
	maxContainerElements = 8192
	frameOverhead        = 8 // type, channel, size and frame-end
	frameHeader          = 2 // content header frame type
	frameMethod          = 1
	maxGuardedFrame      = 64 << 20 // larger header frames are passed on as they are
)

// GuardConn wraps a connection to the broker so that one message can never close it.
//
// RabbitMQ accepts content headers that amqp091-go refuses to parse: a header table nested
// more than 32 deep, a table or array of more than 8,192 entries, an unknown field type, or a
// header frame larger than the negotiated frame_max minus 8 bytes (the broker accepts up to
// frame_max). amqp091-go then closes the connection; the message is delivered again on the
// next one, for ever on a classic queue. GuardConn reads the frames before amqp091-go does and
// replaces such a header table with the single header contract.UnreadableHeader, so that the
// delivery arrives and the subscriber can poison it. Everything else passes through unchanged.
//
// frameMax is the frame size the client asks for (0: no limit); the broker's own, read from
// connection.tune, lowers it as amqp091-go's negotiation does.
func GuardConn(conn net.Conn, frameMax int) net.Conn {
	return &guardConn{Conn: conn, clientMax: frameMax, max: frameMax}
}

type guardConn struct {
	net.Conn
	clientMax, max int
	tuned          bool // connection.tune was seen: method frames need no look

	arr     []byte // where raw is read into, reused
	raw     []byte // read from Conn, not yet looked at: a part of arr
	out     []byte // ready for Read, from off on; reused once read
	off     int
	pass    int // bytes of the current frame still to pass through unchanged
	readErr error
}

// readSize is how much guardConn asks Conn for at a time.
const readSize = 32 << 10

func (g *guardConn) Read(p []byte) (int, error) {
	for len(g.out) == 0 {
		if g.readErr != nil {
			return 0, g.readErr
		}
		if err := g.fill(); err != nil {
			g.readErr = err
		}
		g.process()
	}
	n := copy(p, g.out[g.off:])
	g.off += n
	if g.off == len(g.out) {
		g.out, g.off = g.out[:0], 0
	}
	return n, nil
}

// fill reads after the bytes not looked at yet (raw, a part of arr). When arr has no room
// for a read after them, they move to its front, in an arr with room for as many again and a
// read: the bytes a move copies are paid for by as many read since the last one, so that a
// large frame arriving a few bytes at a time costs linear time, not quadratic.
func (g *guardConn) fill() error {
	if cap(g.raw)-len(g.raw) < readSize {
		if need := 2*len(g.raw) + readSize; len(g.arr) < need {
			g.arr = make([]byte, max(need, 2*len(g.arr)))
		}
		g.raw = g.arr[:copy(g.arr, g.raw)]
	}
	k := len(g.raw)
	n, err := g.Conn.Read(g.raw[k : k+readSize])
	g.raw = g.raw[:k+n]
	return err
}

// process moves what it can from raw to out: frames it does not look into as they come,
// content header frames once they are whole.
func (g *guardConn) process() {
	for len(g.raw) > 0 {
		if g.pass > 0 {
			n := min(g.pass, len(g.raw))
			g.out = append(g.out, g.raw[:n]...)
			g.raw, g.pass = g.raw[n:], g.pass-n
			continue
		}
		if len(g.raw) < 7 {
			break
		}
		typ, size := g.raw[0], int(binary.BigEndian.Uint32(g.raw[3:7]))
		whole := 7 + size + 1
		if (typ != frameHeader && (typ != frameMethod || g.tuned)) || size > maxGuardedFrame {
			g.pass = whole
			continue
		}
		if len(g.raw) < whole {
			break // wait for the rest of the frame
		}
		frame := g.raw[:whole]
		if typ == frameMethod {
			g.tune(frame[7 : 7+size])
		} else {
			frame = g.guard(frame)
		}
		g.out = append(g.out, frame...)
		g.raw = g.raw[whole:]
	}
}

// tune sets the frame limit that amqp091-go negotiates, from connection.tune.
func (g *guardConn) tune(payload []byte) {
	if len(payload) < 10 || binary.BigEndian.Uint16(payload) != 10 || binary.BigEndian.Uint16(payload[2:]) != 30 {
		return
	}
	g.tuned = true
	server := int(binary.BigEndian.Uint32(payload[6:10]))
	size := max(g.clientMax, server)
	if g.clientMax > 0 && server > 0 {
		size = min(g.clientMax, server)
	}
	if size > 0 && size < 4096 {
		size = 4096
	}
	g.max = size
}

// Property flags of a content header, in the order of the properties.
const (
	flagContentType     = 0x8000
	flagContentEncoding = 0x4000
	flagHeaders         = 0x2000
	flagsAfterHeaders   = 0x1FFC // delivery mode ... cluster id
)

// guard returns frame, or a copy of it with the header table replaced when amqp091-go could
// not read it.
func (g *guardConn) guard(frame []byte) []byte {
	payload := frame[7 : len(frame)-1]
	p := parseProperties(payload)
	why := p.err
	if g.max > 0 && len(payload) > g.max-frameOverhead {
		why = fmt.Sprintf("header frame of %d bytes exceeds the frame size %d", len(payload)+frameOverhead, g.max)
	}
	if why == "" || p.tableStart < 0 {
		return frame // readable, or not even its class and flags are there (amqp091-go fails alike)
	}
	table := make([]byte, 0, 64+len(why))
	table = append(table, 0, 0, 0, 0, byte(len(contract.UnreadableHeader)))
	table = append(table, contract.UnreadableHeader...)
	table = append(table, 'S', 0, 0, 0, 0)
	binary.BigEndian.PutUint32(table[len(table)-4:], uint32(len(why)))
	table = append(table, why...)
	binary.BigEndian.PutUint32(table, uint32(len(table)-4))

	out := make([]byte, 0, 7+p.tableStart+len(table)+len(payload)+1)
	out = append(out, frame[:7]...)
	out = append(out, payload[:p.tableStart]...)
	flags := binary.BigEndian.Uint16(out[7+12:]) | flagHeaders
	out = append(out, table...)
	if p.restOK {
		out = append(out, payload[p.tableEnd:]...)
	} else {
		flags &^= flagsAfterHeaders // the properties after the table cannot be read: none
	}
	binary.BigEndian.PutUint16(out[7+12:], flags)
	binary.BigEndian.PutUint32(out[3:7], uint32(len(out)-7))
	return append(out, frame[len(frame)-1])
}

// properties is what guard needs to know of a content header payload.
type properties struct {
	tableStart, tableEnd int    // where the header table is (or would go), length prefix included
	restOK               bool   // the properties after the table can be read
	err                  string // why amqp091-go could not read the properties; "" if it could
}

// parseProperties reads a content header payload as amqp091-go does, but only to check it.
// It is at least as strict: whatever it accepts, amqp091-go reads.
func parseProperties(payload []byte) properties {
	p := properties{tableStart: -1}
	r := &fieldReader{b: payload}
	r.skip(12) // class, weight, body size
	flags := r.u16()
	if flags&flagContentType != 0 {
		r.skip(int(r.u8()))
	}
	if flags&flagContentEncoding != 0 {
		r.skip(int(r.u8()))
	}
	if r.err != nil {
		return p
	}
	p.tableStart, p.tableEnd = r.off, r.off
	if flags&flagHeaders != 0 {
		if err := readTable(r, 0); err != nil {
			p.err = "header table: " + err.Error()
			if r.err != nil {
				return p // its length is not even there: drop what follows
			}
		}
		p.tableEnd = r.off
	}
	rest := &fieldReader{b: payload, off: p.tableEnd}
	for _, f := range []struct {
		flag uint16
		size int // -1: a short string
	}{{0x1000, 1}, {0x0800, 1}, {0x0400, -1}, {0x0200, -1}, {0x0100, -1}, {0x0080, -1},
		{0x0040, 8}, {0x0020, -1}, {0x0010, -1}, {0x0008, -1}, {0x0004, -1}} {
		if flags&f.flag == 0 {
			continue
		}
		if f.size < 0 {
			rest.skip(int(rest.u8()))
		} else {
			rest.skip(f.size)
		}
	}
	p.restOK = rest.err == nil
	if !p.restOK && p.err == "" {
		p.err = "properties after the header table are truncated"
	}
	return p
}

// fieldReader reads AMQP field values as amqp091-go does, only to check them.
type fieldReader struct {
	b   []byte
	off int
	err error
}

var errTruncated = errors.New("truncated")

func (r *fieldReader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.b)-r.off < n {
		r.err = errTruncated
		return nil
	}
	b := r.b[r.off : r.off+n]
	r.off += n
	return b
}

func (r *fieldReader) skip(n int) { r.take(n) }

func (r *fieldReader) u8() byte {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *fieldReader) u16() uint16 {
	if b := r.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *fieldReader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.BigEndian.Uint32(b)
	}
	return 0
}

// readTable checks a table (length prefix first) at depth. It is stricter than amqp091-go in
// two corners: it counts entries rather than distinct keys, and refuses an array that ends in
// the middle of a field.
func readTable(r *fieldReader, depth int) error {
	return readContainer(r, depth, true)
}

func readContainer(r *fieldReader, depth int, table bool) error {
	if depth > maxFieldDepth {
		return fmt.Errorf("nested more than %d deep", maxFieldDepth)
	}
	n := r.u32()
	if n > math.MaxInt32 {
		return errors.New("bad length")
	}
	c := &fieldReader{b: r.take(int(n))}
	if r.err != nil {
		return r.err
	}
	for entries := 0; c.off < len(c.b); entries++ {
		if entries >= maxContainerElements {
			return fmt.Errorf("more than %d entries", maxContainerElements)
		}
		if table {
			c.skip(int(c.u8())) // the key
		}
		if err := readField(c, depth); err != nil {
			return err
		}
	}
	return nil
}

func readField(r *fieldReader, depth int) error {
	typ := r.u8()
	if r.err != nil {
		return r.err
	}
	switch typ {
	case 't', 'B', 'b':
		r.skip(1)
	case 's', 'u':
		r.skip(2)
	case 'I', 'i', 'f':
		r.skip(4)
	case 'l', 'd', 'T':
		r.skip(8)
	case 'D':
		r.skip(5)
	case 'S':
		n := r.u32()
		if n > math.MaxInt32 {
			return errors.New("bad string length")
		}
		r.skip(int(n))
	case 'x':
		n := int32(r.u32())
		if n < 0 {
			return errors.New("bad byte array length")
		}
		r.skip(int(n))
	case 'A':
		return readContainer(r, depth+1, false)
	case 'F':
		return readTable(r, depth+1)
	case 'V':
	default:
		return fmt.Errorf("unknown field type %q", typ)
	}
	return r.err
}
