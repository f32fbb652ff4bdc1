package amqpx

import (
	"bytes"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	server = <-accepted
	require.NotNil(t, server)
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return client, server
}

func TestBatchConnDeliversEveryByteInOrder(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	client, server := tcpPair(t)
	counted := &countingConn{Conn: client}
	b := BatchConn(counted)

	var want bytes.Buffer
	got := make(chan []byte)
	go func() {
		all, _ := io.ReadAll(server)
		got <- all
	}()
	for i := range 20000 { // ~2 MB in writes of 1 to 199 bytes: many gather while one is written
		p := bytes.Repeat([]byte{byte(i)}, 1+i%199)
		want.Write(p)
		n, err := b.Write(p)
		require.NoError(t, err)
		require.Equal(t, len(p), n)
	}
	require.NoError(t, b.Close()) // lets the gathered bytes go out first
	assert.True(t, bytes.Equal(want.Bytes(), <-got), "the bytes read differ from the bytes written")
	assert.Less(t, counted.writes.Load(), int64(20000), "no writes were gathered")
	t.Logf("20000 writes went out in %d", counted.writes.Load())
}

type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

func TestBatchConnReportsAFailedWriteAndClosesTheConnection(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	client, server := tcpPair(t)
	b := BatchConn(client)
	require.NoError(t, server.Close())

	var err error
	for deadline := time.Now().Add(10 * time.Second); err == nil && time.Now().Before(deadline); {
		_, err = b.Write(make([]byte, 64<<10)) // the peer's reset ends the writes
	}
	require.Error(t, err, "writes to a closed peer never failed")
	_, readErr := client.Read(make([]byte, 1))
	assert.ErrorIs(t, readErr, net.ErrClosed, "the failed write did not close the connection for its reader")
	_ = b.Close()
}

func TestBatchConnCloseDoesNotWaitForAPeerThatDoesNotRead(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	client, server := net.Pipe() // a write blocks until the peer reads: a black hole
	defer server.Close()
	b := BatchConn(client)
	_, err := b.Write([]byte("never read"))
	require.NoError(t, err)

	closed := make(chan error, 1)
	go func() { closed <- b.Close() }()
	select {
	case err := <-closed:
		_ = err // the peer reads nothing: what Close says of the flush is not the point
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for a peer that does not read")
	}
	_, err = b.Write([]byte("after close"))
	assert.ErrorIs(t, err, net.ErrClosed)
}

func TestBatchConnWriteWaitsWhileTooMuchIsUnwritten(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	client, server := net.Pipe()
	b := BatchConn(client)

	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		for range 3 { // the first goes to the (blocked) pipe, the second fills the buffer
			if _, err := b.Write(make([]byte, maxUnwritten)); err != nil {
				return
			}
		}
	}()
	select {
	case <-wrote:
		t.Fatal("3 writes of maxUnwritten bytes did not wait for a peer that does not read")
	case <-time.After(200 * time.Millisecond):
	}
	go func() { _, _ = io.Copy(io.Discard, server) }() // the peer reads: the writer goes on
	select {
	case <-wrote:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiting write did not go on once the peer read")
	}
	require.NoError(t, b.Close())
	_ = server.Close()
}
