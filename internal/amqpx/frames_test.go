package amqpx

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/warrenmq/warren/internal/contract"
)

// enc encodes AMQP field tables the way amqp091-go's writer does, for the few types the
// tests need (string, table, array, void).
func encField(v any) []byte {
	switch v := v.(type) {
	case string:
		return append(append([]byte{'S'}, u32(len(v))...), v...)
	case []kv:
		return append([]byte{'F'}, encTable(v)...)
	case []any:
		var body []byte
		for _, e := range v {
			body = append(body, encField(e)...)
		}
		return append(append([]byte{'A'}, u32(len(body))...), body...)
	case nil:
		return []byte{'V'}
	}
	panic("type")
}

type kv struct {
	k string
	v any
}

func encTable(t []kv) []byte {
	var body []byte
	for _, e := range t {
		body = append(body, byte(len(e.k)))
		body = append(body, e.k...)
		body = append(body, encField(e.v)...)
	}
	return append(u32(len(body)), body...)
}

func u32(n int) []byte { return binary.BigEndian.AppendUint32(nil, uint32(n)) }

// headerFrame builds a content header frame with content type "text/plain", the given
// header table (nil: none) and message id "m1".
func headerFrame(headers []byte) []byte {
	p := []byte{0, 60, 0, 0, 0, 0, 0, 0, 0, 0, 0, 5} // class basic, weight, body size 5
	flags := uint16(0x8000 | 0x0080)
	if headers != nil {
		flags |= 0x2000
	}
	p = binary.BigEndian.AppendUint16(p, flags)
	p = append(p, 10)
	p = append(p, "text/plain"...)
	p = append(p, headers...)
	p = append(p, 2, 'm', '1')
	f := append([]byte{2, 0, 1}, u32(len(p))...)
	return append(append(f, p...), 0xCE)
}

var bodyFrame = append(append([]byte{3, 0, 1}, u32(5)...), 'h', 'e', 'l', 'l', 'o', 0xCE)

// through sends in through a GuardConn, one byte per read of the underlying connection, and
// returns what comes out.
func through(t *testing.T, in []byte, frameMax int) []byte {
	t.Helper()
	a, b := net.Pipe()
	go func() {
		for i := range in {
			_, _ = a.Write(in[i : i+1])
		}
		_ = a.Close()
	}()
	g := GuardConn(b, frameMax)
	_ = g.SetDeadline(time.Now().Add(10 * time.Second))
	out, err := io.ReadAll(g)
	require.NoError(t, err)
	return out
}

func nested(depth int) []kv {
	t := []kv{{"leaf", "x"}}
	for range depth {
		t = []kv{{"n", t}}
	}
	return t
}

func many(n int) []kv {
	t := make([]kv, n)
	for i := range t {
		t[i] = kv{k: "h" + strings.Repeat("0", 0) + itoa(i), v: ""}
	}
	return t
}

func itoa(i int) string { return string(binary.BigEndian.AppendUint32(nil, uint32(i))) }

func TestGuardConnPassesReadableFramesUnchanged(t *testing.T) {
	arr := make([]any, maxContainerElements)
	for _, headers := range [][]kv{
		nil,
		{{"a", "b"}},
		nested(maxFieldDepth), // the deepest amqp091-go reads
		many(maxContainerElements),
		{{"arr", arr}},
	} {
		var table []byte
		if headers != nil {
			table = encTable(headers)
		}
		in := append(headerFrame(table), bodyFrame...)
		assert.True(t, bytes.Equal(in, through(t, in, 131072)), "unchanged")
	}
}

func TestGuardConnReplacesUnreadableHeaders(t *testing.T) {
	arr := make([]any, maxContainerElements+1)
	// A frame payload of 131,070 bytes: the broker accepts it (≤ frame_max), amqp091-go
	// does not (> frame_max-8).
	big := strings.Repeat("x", 131070-len(headerFrame(encTable([]kv{{"big", ""}})))+8)
	for name, tc := range map[string]struct {
		table []byte
		why   string
	}{
		"nested 33 deep":       {encTable(nested(maxFieldDepth + 1)), "nested more than 32 deep"},
		"8,193 headers":        {encTable(many(maxContainerElements + 1)), "more than 8192 entries"},
		"array of 8,193":       {encTable([]kv{{"arr", arr}}), "more than 8192 entries"},
		"unknown field type":   {append(u32(3), 1, 'k', '?'), "unknown field type"},
		"frame over frame_max": {encTable([]kv{{"big", big}}), "exceeds the frame size 131072"},
	} {
		t.Run(name, func(t *testing.T) {
			in := append(headerFrame(tc.table), bodyFrame...)
			out := through(t, in, 131072)
			require.True(t, bytes.HasSuffix(out, bodyFrame), "body frame kept")
			hf := out[:len(out)-len(bodyFrame)]
			size := int(binary.BigEndian.Uint32(hf[3:7]))
			require.Equal(t, len(hf), 7+size+1, "frame size field matches")
			require.Equal(t, byte(0xCE), hf[len(hf)-1])
			p := parseProperties(hf[7 : len(hf)-1])
			require.Empty(t, p.err, "the new frame is readable")
			assert.Less(t, len(hf), 1024, "the new header frame is small")
			assert.True(t, bytes.Contains(hf, []byte(contract.UnreadableHeader)), "marker header")
			assert.True(t, bytes.Contains(hf, []byte(tc.why)), "reason %q", tc.why)
			assert.True(t, bytes.Contains(hf, []byte("text/plain")), "properties before the table kept")
			assert.True(t, bytes.HasSuffix(hf, []byte{2, 'm', '1', 0xCE}), "properties after the table kept")
		})
	}
}

// The broker's frame_max, read from connection.tune, lowers the limit as amqp091-go does.
func TestGuardConnFollowsTune(t *testing.T) {
	tune := []byte{0, 10, 0, 30, 0x07, 0xFF}
	tune = append(tune, u32(8192)...)
	tune = append(tune, 0, 60)
	tuneFrame := append(append(append([]byte{1, 0, 0}, u32(len(tune))...), tune...), 0xCE)
	hf := headerFrame(encTable([]kv{{"big", strings.Repeat("y", 9000)}}))
	out := through(t, append(tuneFrame, hf...), 131072)
	assert.Equal(t, tuneFrame, out[:len(tuneFrame)])
	assert.True(t, bytes.Contains(out, []byte("exceeds the frame size 8192")), "limit from tune")
}
