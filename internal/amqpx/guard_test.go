package amqpx_test

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
)

func publishRaw(t *testing.T, env *testenv.Env, queue string, headers amqp.Table, id string) {
	t.Helper()
	ch := env.Channel()
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	require.NoError(t, ch.Confirm(false))
	dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, amqp.Publishing{
		Headers: headers, MessageId: id, Body: []byte("body of " + id), DeliveryMode: amqp.Persistent,
	})
	require.NoError(t, err)
	ok, err := dc.WaitContext(t.Context())
	require.NoError(t, err)
	select {
	case e := <-closed:
		t.Fatalf("publishing %s closed the channel: %v", id, e)
	default:
	}
	require.True(t, ok, "broker confirmed %s", id)
}

// Every hostile header reaches a guarded consumer as a delivery with contract.UnreadableHeader
// and its body and message id, and the connection stays open for the messages behind it; an
// unguarded amqp091-go connection is closed by the same message.
func TestGuardedConnectionReceivesUnreadableHeaders(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	for name := range testenv.HostileHeaders() {
		t.Run(name, func(t *testing.T) {
			queue := env.Name(name)
			env.Remove([]string{queue}, nil)
			_, err := env.Channel().QueueDeclare(queue, true, false, false, false, nil)
			require.NoError(t, err)
			env.InjectHostile(queue, name)
			publishRaw(t, env, queue, amqp.Table{"n": "1"}, "behind")

			plain, err := amqp.Dial(env.URL) // unguarded: amqpx.Dial and Env.Dial guard
			require.NoError(t, err)
			defer plain.Close()
			pch, err := plain.Channel()
			require.NoError(t, err)
			closed := plain.NotifyClose(make(chan *amqp.Error, 1))
			_, _, _ = pch.Get(queue, false)
			select {
			case cerr := <-closed:
				t.Logf("an unguarded connection closes: %v", cerr)
			case <-time.After(testenv.Patience()):
				t.Fatal("an unguarded connection survived the hostile header: the fixture is not hostile")
			}
			// The broker requeues the message once it has seen the connection go, which can be
			// after the client has: until then the next Get would take the one behind it.
			ready := env.Channel()
			require.Eventually(t, func() bool {
				q, err := ready.QueueDeclarePassive(queue, true, false, false, false, nil)
				return err == nil && q.Messages == 2
			}, testenv.Patience(), 10*time.Millisecond, "the hostile message requeued")

			conn, _, err := amqpx.Dial(t.Context(), env.Connection(), "guard test")
			require.NoError(t, err)
			defer conn.Close()
			ch, err := conn.Channel()
			require.NoError(t, err)
			d, ok, err := ch.Get(queue, false)
			require.NoError(t, err)
			require.True(t, ok)
			assert.Equal(t, "hostile", d.MessageId)
			assert.Equal(t, name, string(d.Body))
			assert.NotEmpty(t, d.Headers[contract.UnreadableHeader])
			t.Logf("%s: %s", name, d.Headers[contract.UnreadableHeader])
			require.NoError(t, d.Ack(false))

			d, ok, err = ch.Get(queue, false)
			require.NoError(t, err)
			require.True(t, ok, "the message behind it arrives on the same connection")
			assert.Equal(t, "1", d.Headers["n"])
			require.NoError(t, d.Ack(false))
			assert.False(t, conn.IsClosed())
		})
	}
}

// Headers at amqp091-go's limits are readable and pass the guard untouched.
func TestGuardedConnectionKeepsReadableHeaders(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Name("readable")
	env.Remove([]string{queue}, nil)
	_, err := env.Channel().QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	fixtures := []amqp.Table{testenv.NestedTable(32), testenv.ManyHeaders(8192), {"arr": []any{"a", int32(1), amqp.Table{"x": "y"}}}}
	for i, h := range fixtures {
		publishRaw(t, env, queue, h, strconv.Itoa(i))
	}
	conn, _, err := amqpx.Dial(t.Context(), env.Connection(), "guard test")
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	for i, want := range fixtures {
		d, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		require.True(t, ok)
		assert.Equal(t, strconv.Itoa(i), d.MessageId)
		assert.NotContains(t, d.Headers, contract.UnreadableHeader)
		assert.Equal(t, len(want), len(d.Headers))
	}
}

// HeaderFrameSize agrees byte for byte with the content header frame amqp091-go writes,
// measured on the wire between the client and the broker.
func TestHeaderFrameSizeMatchesTheWire(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	sizes := make(chan int, 16)
	addr := sniff(t, strings.TrimSuffix(strings.TrimPrefix(env.URL, "amqp://guest:guest@"), "/"), sizes)
	conn, err := amqp.Dial("amqp://guest:guest@" + addr + "/")
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	now := time.Now()
	for _, p := range []amqp.Publishing{
		{},
		{MessageId: "m", Headers: amqp.Table{"s": "v"}},
		{
			ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: 2, Priority: 3,
			CorrelationId: "c", ReplyTo: "r", Expiration: "100000", MessageId: "m", Timestamp: now,
			Type: "t", UserId: "guest", AppId: "a",
			Headers: amqp.Table{"s": "v", "i": int32(1), "l": int64(2), "b": true, "f": 1.5, "x": []byte("xy"),
				"t": now, "n": nil, "d": amqp.Decimal{Scale: 1, Value: 5}, "u": uint16(7),
				"nested": amqp.Table{"a": []any{"x", int16(1), amqp.Table{}}}},
		},
	} {
		want, err := amqpx.HeaderFrameSize(p)
		require.NoError(t, err)
		require.NoError(t, ch.Publish("", "no-such-queue-"+env.ID, false, false, p))
		select {
		case got := <-sizes:
			assert.Equal(t, got, want)
		case <-time.After(testenv.Patience()):
			t.Fatal("no header frame seen")
		}
	}
	_, err = amqpx.HeaderFrameSize(amqp.Publishing{Headers: amqp.Table{"bad": struct{}{}}})
	assert.ErrorContains(t, err, `header "bad"`)
}

// sniff forwards one connection to target and sends the payload size of every content header
// frame the client writes to sizes.
func sniff(t *testing.T, target string, sizes chan<- int) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		u, err := net.Dial("tcp", target)
		if err != nil {
			return
		}
		defer u.Close()
		go func() { _, _ = io.Copy(c, u) }()
		r := bufio.NewReader(io.TeeReader(c, u))
		if _, err := io.ReadFull(r, make([]byte, 8)); err != nil { // protocol header
			return
		}
		hdr := make([]byte, 7)
		for {
			if _, err := io.ReadFull(r, hdr); err != nil {
				return
			}
			size := int(binary.BigEndian.Uint32(hdr[3:]))
			if _, err := io.ReadFull(r, make([]byte, size+1)); err != nil {
				return
			}
			if hdr[0] == 2 {
				sizes <- size
			}
		}
	}()
	return l.Addr().String()
}
