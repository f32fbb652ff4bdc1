package router_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/router"
)

// Consumers resume by themselves after the broker drops their connections, or restarts,
// while messages flow; every message published (Publish returned nil) is processed.
func TestConsumersResumeAfterConnectionLoss(t *testing.T) {
	t.Parallel() // its broker nodes are its own, on ports of their own
	for name, fault := range map[string]func(*testenv.Node){
		"close_all_connections": (*testenv.Node).CloseAllConnections,
		"restart":               (*testenv.Node).Restart,
	} {
		t.Run(name, func(t *testing.T) {
			node := testenv.StartNode(t)
			const queue, total = "work", 400

			r, err := router.New(router.Config{Connection: warren.Connection{URL: node.URL()}, ShutdownTimeout: 5 * time.Second}, testenv.New(t).Logger())
			require.NoError(t, err)
			defer r.Close()
			var (
				mu    sync.Mutex
				count = map[string]int{}
			)
			require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue, Concurrency: 8}, func(msg *message.Message) error {
				time.Sleep(2 * time.Millisecond) // simulates work
				mu.Lock()
				count[msg.UUID]++
				mu.Unlock()
				return nil
			}))
			go func() { _ = r.Run(context.Background()) }()
			<-r.Running()
			processed := func() int {
				mu.Lock()
				defer mu.Unlock()
				return len(count)
			}

			pub, err := dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: node.URL()}, PublishTimeout: 60 * time.Second}, nil)
			require.NoError(t, err)
			defer pub.Close()
			published := make(chan error, 1)
			go func() { // one message every 3ms at most: they still flow when the fault comes
				pace := time.NewTicker(3 * time.Millisecond)
				defer pace.Stop()
				for i := range total {
					if err := pub.Publish(queue, message.NewMessage(strconv.Itoa(i), nil)); err != nil {
						published <- err
						return
					}
					<-pace.C
				}
				published <- nil
			}()

			require.Eventually(t, func() bool { return processed() >= total/4 }, testenv.Patience(), 5*time.Millisecond)
			fault(node)
			t.Logf("%s after %d messages", name, processed())

			require.NoError(t, <-published, "Publish returned an error")
			require.Eventually(t, func() bool { return processed() == total }, 2*testenv.Patience(), 20*time.Millisecond,
				"processed %d of %d", processed(), total)
			mu.Lock()
			dups := 0
			for _, n := range count {
				dups += n - 1
			}
			mu.Unlock()
			t.Logf("all %d processed; %d processed twice (acks lost with the connection)", total, dups)
			assert.Less(t, dups, total/4)
		})
	}
}

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
