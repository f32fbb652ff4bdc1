//go:build faults

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
