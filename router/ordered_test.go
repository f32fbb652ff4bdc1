package router_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// orderedRouter is a router whose Config.Declare lists queue q with lanes lanes (so that its
// publisher routes by key), with the lanes registered for removal.
func orderedRouter(t *testing.T, env *testenv.Env, q string, lanes int, retry middleware.BackoffConfig) *router.Router {
	t.Helper()
	var names []string
	for i := range lanes {
		names = append(names, topology.LaneQueue(q, i), topology.HeldQueue(q, i))
	}
	env.Remove(append(names, topology.HeldState(q)), nil)
	return newRouter(t, env, func(c *router.Config) {
		c.Declare = topology.Topology{Queues: []topology.Queue{{Name: q, Lanes: lanes}}}
		c.Retry = retry
		c.Concurrency = 8
	})
}

// keyed returns a message of key key, its id key/seq.
func keyed(key string, seq int) *message.Message {
	msg := message.NewMessage(fmt.Sprintf("%s/%d", key, seq), nil)
	warren.OrderBy(msg, key)
	return msg
}

// A handler of a queue ordered by key handles the messages of each key one at a time, in the
// order published, while some fail and are retried in place; a message without a key that
// arrives in the queue itself is handled too.
func TestOrderedHandlerKeepsEachKeysOrderThroughRetries(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("ordered")
	r := orderedRouter(t, env, q, 4, middleware.BackoffConfig{Delays: []time.Duration{20 * time.Millisecond}, MaxAttempts: 3})
	const keys, each = 8, 25
	var (
		mu       sync.Mutex
		busy     = map[string]int{}
		handled  = map[string][]string{}
		overlaps []string
		plain    = make(chan struct{}, 1)
		total    int
		done     = make(chan struct{})
	)
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: q, Lanes: 4}, func(msg *message.Message) error {
		key := warren.OrderKey(msg)
		if key == "" {
			plain <- struct{}{}
			return nil
		}
		mu.Lock()
		busy[key]++
		if busy[key] > 1 {
			overlaps = append(overlaps, msg.UUID)
		}
		mu.Unlock()
		time.Sleep(time.Millisecond) // room for the next of the key to pass, were it let through
		mu.Lock()
		defer mu.Unlock()
		busy[key]--
		var seq int
		_, _ = fmt.Sscanf(msg.UUID[len(key)+1:], "%d", &seq)
		if seq%5 == 2 && middleware.Attempt(msg) == 1 {
			return errors.New("fails once")
		}
		handled[key] = append(handled[key], msg.UUID)
		if total++; total == keys*each {
			close(done)
		}
		return nil
	}))
	start(t, r)

	var msgs []*message.Message
	want := map[string][]string{}
	for seq := range each {
		for k := range keys {
			key := fmt.Sprintf("key-%d", k)
			msgs = append(msgs, keyed(key, seq))
			want[key] = append(want[key], fmt.Sprintf("%s/%d", key, seq))
		}
	}
	require.NoError(t, r.Publisher().Publish(q, msgs...))
	select {
	case <-done:
	case <-time.After(testenv.Patience()):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d of %d messages handled", total, keys*each)
	}
	mu.Lock()
	assert.Equal(t, want, handled, "each key's messages in the order published")
	assert.Empty(t, overlaps, "no key had two messages in a handler at once")
	mu.Unlock()

	// A message without a key, in the queue itself or in a lane (from a publisher outside
	// warren), is handled as it comes.
	ch := env.Channel()
	require.NoError(t, ch.Publish("", q, false, false, amqp.Publishing{MessageId: "plain"}))
	require.NoError(t, ch.Publish("", topology.LaneQueue(q, 0), false, false, amqp.Publishing{MessageId: "plain in a lane"}))
	for range 2 {
		select {
		case <-plain:
		case <-time.After(testenv.Patience()):
			t.Fatal("the message without a key was not handled")
		}
	}
}

// A failure holds its key alone: the key's next message waits until the failed one is handled,
// while another key of the same lane goes on. Here the failing message fails until the other
// key's messages are all handled, so that it can only succeed if they passed it.
func TestOrderedFailureHoldsOnlyItsKey(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("held")
	const lanes = 2
	r := orderedRouter(t, env, q, lanes, middleware.BackoffConfig{Delays: []time.Duration{50 * time.Millisecond}, MaxAttempts: 100})
	stuck, free := "stuck", ""
	for i := 0; free == ""; i++ {
		if k := fmt.Sprintf("free-%d", i); topology.Lane(k, lanes) == topology.Lane(stuck, lanes) {
			free = k
		}
	}
	const frees = 10
	var (
		mu      sync.Mutex
		order   []string
		freeOK  int
		done    = make(chan struct{})
		stuckOK = 0
	)
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: q, Lanes: lanes}, func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		if msg.UUID == stuck+"/0" && freeOK < frees {
			return errors.New("held until the other key is through")
		}
		order = append(order, msg.UUID)
		if warren.OrderKey(msg) == free {
			freeOK++
		} else {
			stuckOK++
		}
		if freeOK == frees && stuckOK == 2 {
			close(done)
		}
		return nil
	}))
	start(t, r)
	msgs := []*message.Message{keyed(stuck, 0), keyed(stuck, 1)}
	for i := range frees {
		msgs = append(msgs, keyed(free, i))
	}
	require.NoError(t, r.Publisher().Publish(q, msgs...))
	select {
	case <-done:
	case <-time.After(testenv.Patience()):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("handled: %v", order)
	}
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, order, frees+2)
	assert.Equal(t, []string{stuck + "/0", stuck + "/1"}, order[frees:], "the held key after the other, in its order: %v", order)
}

// A kill of a queue ordered by key stops the consumers of its lanes too: what is published
// meanwhile waits in the lanes, and a resume has it handled.
func TestKillOfAnOrderedQueueStopsItsLanes(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("killed")
	env.Remove([]string{kill.StateQueue(q, nil), kill.ListenerQueue(q), kill.LockQueue(q)}, nil)
	const lanes = 2
	r := orderedRouter(t, env, q, lanes, middleware.BackoffConfig{})
	var handled atomic.Int64
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: q, Lanes: lanes}, func(*message.Message) error {
		handled.Add(1)
		return nil
	}))
	start(t, r)
	k := newKiller(t, env, "")
	require.NoError(t, k.Kill(t.Context(), q, kill.Stop))
	require.Eventually(t, func() bool {
		for i := range lanes {
			if inspectQueue(t, env, topology.LaneQueue(q, i)).Consumers > 0 {
				return false
			}
		}
		return true
	}, testenv.Patience(), 20*time.Millisecond, "the lanes' consumers stopped")
	var msgs []*message.Message
	for i := range 6 {
		msgs = append(msgs, keyed(fmt.Sprintf("k%d", i), 0))
	}
	require.NoError(t, r.Publisher().Publish(q, msgs...))
	waiting := 0
	for i := range lanes {
		waiting += inspectQueue(t, env, topology.LaneQueue(q, i)).Messages
	}
	assert.Equal(t, 6, waiting, "in the lanes, unconsumed")
	assert.Zero(t, handled.Load())

	require.NoError(t, k.Resume(t.Context(), q))
	require.Eventually(t, func() bool { return handled.Load() == 6 }, testenv.Patience(), 20*time.Millisecond)
}

// Two processes running the handler of a queue ordered by key share its lanes; when one
// closes, the other takes its lanes over, and every key's messages are still handled in the
// order published, across both.
func TestOrderedLanesAreSharedAndTakenOver(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("shared")
	env.Remove([]string{router.MembersQueue(q)}, nil)
	const lanes = 4
	retry := middleware.BackoffConfig{Delays: []time.Duration{10 * time.Millisecond}}
	routers := []*router.Router{orderedRouter(t, env, q, lanes, retry), orderedRouter(t, env, q, lanes, retry)}
	var (
		mu      sync.Mutex
		order   = map[string][]int{} // key -> seqs as handled, first time each
		seen    = map[string]bool{}
		byProc  = make([]int, len(routers))
		handled int
	)
	for i, r := range routers {
		require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: q, Lanes: lanes}, func(msg *message.Message) error {
			time.Sleep(time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			byProc[i]++
			if !seen[msg.UUID] {
				seen[msg.UUID] = true
				key := warren.OrderKey(msg)
				var seq int
				_, _ = fmt.Sscanf(msg.UUID[len(key)+1:], "%d", &seq)
				order[key] = append(order[key], seq)
				handled++
			}
			return nil
		}))
		start(t, routers[i])
	}
	published := 0
	publish := func(n int) {
		var msgs []*message.Message
		for range n {
			msgs = append(msgs, keyed(fmt.Sprintf("k%02d", published%40), published/40))
			published++
		}
		require.NoError(t, routers[1].Publisher().Publish(q, msgs...))
	}
	require.Eventually(t, func() bool {
		publish(40)
		mu.Lock()
		defer mu.Unlock()
		return byProc[0] > 0 && byProc[1] > 0
	}, testenv.Patience(), 200*time.Millisecond, "both processes handle some lanes")

	publish(400)
	closed := make(chan error, 1)
	go func() { closed <- routers[0].Close() }() // while the messages flow
	publish(400)
	require.NoError(t, <-closed)
	mu.Lock()
	before := byProc[1]
	mu.Unlock()
	publish(200)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return handled == published
	}, testenv.Patience(), 20*time.Millisecond, "every message handled")
	mu.Lock()
	defer mu.Unlock()
	assert.GreaterOrEqual(t, byProc[1]-before, 200, "the remaining process took every lane over")
	for key, seqs := range order {
		for i := 1; i < len(seqs); i++ {
			if seqs[i] < seqs[i-1] {
				t.Errorf("key %s: handled out of order: %v", key, seqs)
				break
			}
		}
	}
}
