package amqpx_test

import (
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
)

// Users of a Conn share one connection: calls made at once dial once, a lost connection is
// dialed again once, at the next call, and Close ends it for every user.
func TestConnIsSharedAndDialedAgainOnce(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	proxy, url := testenv.ProxyURL(t, env.URL)
	var (
		mu     sync.Mutex
		events []warren.ConnectionState
	)
	c := amqpx.NewConn(amqpx.NewDialer(warren.Connection{URL: url, OnEvent: func(e warren.ConnectionEvent) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, e.State)
	}}, "warren test", nil))
	defer c.Close()
	count := func(s warren.ConnectionState) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, e := range events {
			if e == s {
				n++
			}
		}
		return n
	}
	getAll := func() []*amqp.Connection {
		t.Helper()
		conns := make([]*amqp.Connection, 8)
		var wg sync.WaitGroup
		for i := range conns {
			wg.Go(func() {
				conn, err := c.Get(t.Context())
				assert.NoError(t, err)
				conns[i] = conn
			})
		}
		wg.Wait()
		return conns
	}

	first := getAll()
	require.NotNil(t, first[0])
	for _, conn := range first {
		assert.Same(t, first[0], conn)
	}
	assert.Equal(t, 1, count(warren.Connected))
	assert.Same(t, first[0], c.Current())

	proxy.Drop() // the connection is lost
	require.Eventually(t, func() bool { return first[0].IsClosed() }, testenv.Patience(), 5*time.Millisecond)
	assert.Nil(t, c.Current(), "no connection is open")
	second := getAll()
	require.NotNil(t, second[0])
	assert.NotSame(t, first[0], second[0])
	for _, conn := range second {
		assert.Same(t, second[0], conn)
	}
	assert.Equal(t, 2, count(warren.Connected), "connected again once")

	require.NoError(t, c.Close())
	assert.True(t, second[0].IsClosed())
	_, err := c.Get(t.Context())
	assert.ErrorIs(t, err, amqpx.ErrConnClosed)
}
