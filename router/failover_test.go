package router_test

import (
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/router"
)

// Given the addresses of two nodes, a router whose node goes fails over to the other, says
// so through Connection.OnEvent, and goes on processing; its publisher follows at its next
// publish. (Two proxies of the same broker stand for the nodes.)
func TestRouterFailsOverToAnotherNode(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	a, urlA := testenv.ProxyURL(t, env.URL)
	b, urlB := testenv.ProxyURL(t, env.URL)
	var (
		mu     sync.Mutex
		events []warren.ConnectionEvent
	)
	r := newRouter(t, env, func(c *router.Config) {
		c.Connection.URL = urlA + "," + urlB
		c.Connection.OnEvent = func(e warren.ConnectionEvent) {
			mu.Lock()
			defer mu.Unlock()
			events = append(events, e)
		}
	})
	seen := func(name string, state warren.ConnectionState) (warren.ConnectionEvent, bool) {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range events {
			if e.Name == name && e.State == state {
				return e, true
			}
		}
		return warren.ConnectionEvent{}, false
	}
	queue := env.Queue("work")
	processed := make(chan string, 10)
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Name: "h", Queue: queue}, func(msg *message.Message) error {
		processed <- msg.UUID
		return nil
	}))
	start(t, r)
	await := func(id string) {
		t.Helper()
		require.NoError(t, r.Publisher().Publish(queue, message.NewMessage(id, nil)))
		select {
		case got := <-processed:
			assert.Equal(t, id, got)
		case <-time.After(testenv.Patience()):
			t.Fatalf("%s not processed", id)
		}
	}
	await("before")

	const sub = "warren subscriber" // the router's consuming connection, every handler's
	first, ok := seen(sub, warren.Connected)
	if !ok {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("the subscriber's connection is not reported: %v", events)
	}
	gone := a
	if first.Node == b.Addr() {
		gone = b
	}
	gone.Close()
	require.Eventually(t, func() bool { _, ok := seen(sub, warren.FailedOver); return ok }, testenv.Patience(), 10*time.Millisecond)
	lost, ok := seen(sub, warren.Reconnecting)
	require.True(t, ok)
	assert.Equal(t, gone.Addr(), lost.Node)
	assert.Error(t, lost.Err)
	moved, _ := seen(sub, warren.FailedOver)
	assert.Equal(t, gone.Addr(), moved.Previous)
	assert.NotEqual(t, gone.Addr(), moved.Node)
	await("after")
}
