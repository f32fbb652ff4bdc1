package router_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/middleware/redisstore"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// copyStores returns n Redis CopyStores under one prefix of the test's own, as n processes
// of a service would have them.
func copyStores(t *testing.T, env *testenv.Env, n int) []middleware.IdempotencyStore {
	t.Helper()
	prefix := "warren:test:" + env.Name("copies") + ":"
	client := testenv.Redis(t, prefix)
	stores := make([]middleware.IdempotencyStore, n)
	for i := range stores {
		s, err := redisstore.New(redisstore.Config{Client: client, Prefix: prefix}, env.Logger())
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		stores[i] = s
	}
	return stores
}

// A copy of a message that one process handled (a publisher's re-send after a lost confirm,
// a redelivery after an ack lost with its connection) reaches another process: with a shared
// CopyStore it is acked there without being handled; without one it would be handled again.
func TestCopyStoreRecognisesACopyHandledByAnotherProcess(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("copies")
	stores := copyStores(t, env, 2)
	var n calls
	handler := func(msg *message.Message) error {
		n.add(msg.UUID)
		return nil
	}
	first := newRouter(t, env, func(c *router.Config) { c.CopyStore = stores[0] })
	require.NoError(t, first.AddConsumerHandler(router.HandlerConfig{Queue: queue}, handler))
	start(t, first)
	copyOf := amqp.Publishing{MessageId: "m", Headers: amqp.Table{contract.PublishIDHeader: "p1"}}
	publishRaw(t, env, "", queue, copyOf)
	require.Eventually(t, func() bool { return n.get("m") == 1 }, testenv.Patience(), 10*time.Millisecond)
	require.NoError(t, first.Close())

	second := newRouter(t, env, func(c *router.Config) { c.CopyStore = stores[1] })
	require.NoError(t, second.AddConsumerHandler(router.HandlerConfig{Queue: queue}, handler))
	start(t, second)
	publishRaw(t, env, "", queue, copyOf)
	publishRaw(t, env, "", queue, amqp.Publishing{MessageId: "later", Headers: amqp.Table{contract.PublishIDHeader: "p2"}})
	require.Eventually(t, func() bool { return n.get("later") == 1 }, testenv.Patience(), 10*time.Millisecond)
	assert.Equal(t, 1, n.get("m"), "the copy is acked, not handled")
	assert.Zero(t, env.Messages(queue))
}

// Copies of an always-failing message handled at once by two processes make one chain of
// attempts between them: MaxAttempts handler calls in all, one poison message.
func TestCopyStoreMakesOneChainAcrossProcesses(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("copies")
	stores := copyStores(t, env, 2)
	var n calls
	for _, store := range stores {
		r := newRouter(t, env, func(c *router.Config) {
			c.CopyStore = store
			c.Retry = middleware.BackoffConfig{Delays: []time.Duration{50 * time.Millisecond, 50 * time.Millisecond}}
			c.RequeueDelay = 100 * time.Millisecond
			c.Concurrency, c.Prefetch = 1, 1 // a busy process takes nothing more: the twin goes to the other
		})
		require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(msg *message.Message) error {
			n.add(msg.UUID)
			time.Sleep(100 * time.Millisecond) // simulates work: the twin arrives at the other process meanwhile
			return errors.New("always fails")
		}))
		start(t, r)
	}
	twin := amqp.Publishing{MessageId: "m", Headers: amqp.Table{contract.PublishIDHeader: "f1"}}
	publishRaw(t, env, "", queue, twin)
	publishRaw(t, env, "", queue, twin)
	d := poisoned(t, env, queue, testenv.Patience())
	assert.Equal(t, "m", d.MessageId)
	require.Eventually(t, func() bool { return env.Messages(queue) == 0 }, testenv.Patience(), 20*time.Millisecond)
	assert.Equal(t, 3, n.get("m"), "one call per attempt, MaxAttempts 3")
	assert.Zero(t, env.Messages(topology.PoisonQueue(queue)), "poisoned once")
}

// A message published twice with one message id (two publishes: CopyStore does not take them
// for copies) reaches two processes whose handlers are guarded by Idempotent keyed by
// MessageIDKey in HandlerConfig.Middleware, inside Backoff. Its first attempt fails: the key
// is given up, so that the other copy or the retry (which keeps the message id) succeeds,
// once; whichever comes last is acked unhandled.
func TestMessageIDGuardInHandlerMiddlewareLetsARetryThrough(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("ids")
	stores := copyStores(t, env, 2)
	var n calls
	var mu sync.Mutex
	returned := map[bool]int{} // handler chain results seen inside Backoff: failed or not
	for _, store := range stores {
		once, err := middleware.NewIdempotent(middleware.IdempotentConfig{Store: store, Key: middleware.MessageIDKey}, env.Logger())
		require.NoError(t, err)
		record := func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := h(msg)
				mu.Lock()
				returned[err != nil]++
				mu.Unlock()
				return out, err
			}
		}
		r := newRouter(t, env, func(c *router.Config) {
			c.Retry = middleware.BackoffConfig{Delays: []time.Duration{50 * time.Millisecond}}
		})
		require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{
			Queue: queue, Middleware: []message.HandlerMiddleware{record, once.Middleware},
		}, func(msg *message.Message) error {
			if n.add(msg.UUID) == 1 {
				return errors.New("fails once")
			}
			n.add("success")
			return nil
		}))
		start(t, r)
	}
	publishRaw(t, env, "", queue, amqp.Publishing{MessageId: "m", Headers: amqp.Table{contract.PublishIDHeader: "p1"}})
	publishRaw(t, env, "", queue, amqp.Publishing{MessageId: "m", Headers: amqp.Table{contract.PublishIDHeader: "p2"}})
	// Three deliveries: the failed first attempt, the other copy and the retry.
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return returned[true] == 1 && returned[false] == 2
	}, testenv.Patience(), 10*time.Millisecond)
	assert.Equal(t, 2, n.get("m"), "the failed attempt and one success")
	assert.Equal(t, 1, n.get("success"))
	require.Eventually(t, func() bool { return env.Messages(queue) == 0 }, testenv.Patience(), 20*time.Millisecond)
	assert.Zero(t, env.Messages(topology.PoisonQueue(queue)))
}
