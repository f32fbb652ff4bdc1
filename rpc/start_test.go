package rpc_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/rpc"
	"github.com/warrenmq/warren/topology"
)

// TestServersAnswerFromTheStart: 3 servers that just started, and 128 callers at once, in
// both modes: every call is answered, and no server opened a publishing connection for its
// replies, direct ones included (they go out on the router's publishing connection, opened
// by New), let alone one per concurrent first reply.
// The p99 of the calls made in the first second is logged (go test -v), not asserted.
func TestServersAnswerFromTheStart(t *testing.T) {
	const servers, callers, clients = 3, 128, 8
	for _, mode := range []string{"direct", "queue"} {
		t.Run(mode, func(t *testing.T) {
			env := testenv.Logic(t)
			queue := env.Queue("start")
			opened := make([]*atomic.Int32, servers) // publishing connections, per server
			var routers []*router.Router
			for i := range servers {
				opened[i] = new(atomic.Int32)
				conn := env.Connection()
				conn.OnEvent = func(e warren.ConnectionEvent) {
					if e.State == warren.Connected && e.Name == "warren publisher" {
						opened[i].Add(1)
					}
				}
				r, err := router.New(router.Config{
					Connection:      conn,
					ShutdownTimeout: 10 * time.Second,
					Topology:        topology.Config{Delay: env.Delay(topology.Delay{})},
				}, env.Logger())
				require.NoError(t, err)
				t.Cleanup(func() { _ = r.Close() })
				require.NoError(t, r.AddHandler(router.HandlerConfig{Queue: queue, Reply: true}, rpc.Handler(double)))
				routers = append(routers, r)
			}
			base := make([]int32, servers) // the router's publishing connection, opened by New
			for i := range servers {
				base[i] = opened[i].Load()
			}
			for _, r := range routers {
				done := make(chan error, 1)
				go func() { done <- r.Run(context.Background()) }()
				t.Cleanup(func() { _ = stop(r, done) })
				select {
				case <-r.Running():
				case err := <-done:
					t.Fatalf("router stopped at once: %v", err)
				case <-time.After(testenv.Patience()):
					t.Fatal("router did not start")
				}
			}
			cs := make([]*rpc.Client, clients)
			for i := range cs {
				cs[i] = newClient(t, env, func(c *rpc.ClientConfig) {
					if mode == "queue" {
						c.ReplyQueue = env.Name(fmt.Sprintf("replies-%d", i))
						env.Remove([]string{c.ReplyQueue}, nil)
					}
				})
			}

			var (
				mu    sync.Mutex
				first []time.Duration // latencies of the calls made in the first second
				calls atomic.Int32
				wg    sync.WaitGroup
			)
			begin := time.Now()
			for i := range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := cs[i%clients]
					for n := 0; time.Since(begin) < time.Second; n++ {
						at := time.Now()
						req := request{N: n, From: fmt.Sprintf("caller-%d", i)}
						resp, err := rpc.Call[request, response](context.Background(), c, queue, req)
						if !assert.NoError(t, err, "call %d of caller %d", n, i) {
							return
						}
						assert.Equal(t, response{N: n, Double: 2 * n, From: req.From}, resp)
						calls.Add(1)
						mu.Lock()
						first = append(first, time.Since(at))
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			for i := range servers {
				assert.EqualValues(t, 1, base[i], "server %d: publishing connections opened by New", i)
				assert.EqualValues(t, 0, opened[i].Load()-base[i], "server %d: publishing connections opened for the replies", i)
			}
			slices.Sort(first)
			require.NotEmpty(t, first)
			t.Logf("%s: %d calls in the first second, by %d callers; p50 %s, p99 %s, max %s", mode, calls.Load(), callers,
				first[len(first)/2], first[len(first)*99/100], first[len(first)-1])
		})
	}
}
