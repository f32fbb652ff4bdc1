package amqpx_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpurl"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
)

// refusedURL returns the URL of a port nobody listens on.
func refusedURL(t *testing.T) string {
	return "amqp://guest:s3cr3t@" + testenv.ClosedPort(t) + "/"
}

// A list is tried in a random order until a node answers: a node down is passed over
// whatever its place.
func TestDialTriesEveryNodeOfAList(t *testing.T) {
	t.Parallel()
	testenv.NeedsBroker(t)
	list := refusedURL(t) + "," + testenv.URL() + "," + refusedURL(t)
	for range 6 {
		conn, _, err := amqpx.Dial(context.Background(), warren.Connection{URL: list}, "test")
		require.NoError(t, err)
		require.NoError(t, conn.Close())
	}
}

// When no node answers, the error names every node (without its password) and why.
//
// Not parallel: it bounds the time the dial takes.
func TestDialOfAListWithoutALiveNodeNamesEveryNode(t *testing.T) {
	a, b := refusedURL(t), "amqp://guest:s3cr3t@"+blackHole(t)+"/"
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, _, err := amqpx.Dial(ctx, warren.Connection{URL: a + "," + b}, "test")
	// Each node gets a share of the time left: the black hole, tried first, half of it.
	assert.LessOrEqual(t, time.Since(start), 1100*time.Millisecond+150*time.Millisecond)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no node of 2 answered")
	for _, u := range []string{a, b} {
		assert.Contains(t, err.Error(), amqpurl.Redact(u))
	}
	assert.NotContains(t, err.Error(), "s3cr3t")
	assert.True(t, strings.Contains(err.Error(), "refused"), err.Error())
}

// A broker that accepts the TCP connection and never answers the handshake (a RabbitMQ 3.x
// node out of file handles does that) gets an error that names the likely causes and how to
// check them, and still wraps the deadline; one that answered something does not, and
// neither does a dial the caller cancelled.
func TestDialWithoutAnswerNamesTheLikelyCauses(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, _, err := amqpx.Dial(ctx, warren.Connection{URL: "amqp://guest:guest@" + testenv.BlackHole(t) + "/"}, "test")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "AMQP handshake with 127.0.0.1:")
	for _, s := range []string{"sent nothing back", "file handles", "/api/nodes", "rabbitmqctl status",
		"file_handle_cache:info()", "resource alarm", "overloaded"} {
		assert.Contains(t, err.Error(), s)
	}

	// One byte of a frame header, then nothing: the broker answered.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
			_, _ = c.Write([]byte{1})
		}
	}()
	ctx, cancel = context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, _, err = amqpx.Dial(ctx, warren.Connection{URL: "amqp://guest:guest@" + l.Addr().String() + "/"}, "test")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.NotContains(t, err.Error(), "file handles")

	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	_, _, err = amqpx.Dial(ctx, warren.Connection{URL: "amqp://guest:guest@" + testenv.BlackHole(t) + "/"}, "test")
	require.ErrorIs(t, err, context.Canceled)
	assert.NotContains(t, err.Error(), "file handles")
}
