package router_test

import (
	"context"
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
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/rpc"
	"github.com/warrenmq/warren/topology"
)

// connectionLog records the connections a component reports through Connection.OnEvent.
type connectionLog struct {
	mu     sync.Mutex
	events []warren.ConnectionEvent
}

func (l *connectionLog) add(e warren.ConnectionEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

// opened counts the connections opened (connected, or connected again), by name.
func (l *connectionLog) opened() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := map[string]int{}
	for _, e := range l.events {
		if e.State != warren.Reconnecting {
			n[e.Name]++
		}
	}
	return n
}

// count counts the events of state on the connections called name.
func (l *connectionLog) count(state warren.ConnectionState, name string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.events {
		if e.State == state && e.Name == name {
			n++
		}
	}
	return n
}

// A router with 20 handlers holds at most 3 connections to the broker, counted by the broker
// (its management API lists them, by a connection_name prefix of the test's own), while every
// handler consumes and the router publishes what its handlers return, a retry and a direct
// reply.
func TestRouterWithManyHandlersHoldsFewConnections(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	const handlers = 20
	prefix := env.Name("conns")
	var log connectionLog
	r := newRouter(t, env, func(c *router.Config) {
		c.Connection.AMQP.Properties = amqp.Table{"connection_name": prefix}
		c.Connection.OnEvent = log.add
		c.Retry.Delays = []time.Duration{time.Millisecond}
		c.Retry.MaxAttempts = 2
	})
	var (
		mu       sync.Mutex
		got      = map[string]int{}
		attempts = map[string]int{}
	)
	queues := make([]string, handlers)
	for i := range queues {
		queues[i] = env.Queue(fmt.Sprintf("h%02d", i))
	}
	const outputs, retried, replies = 0, 1, 2 // handlers that publish an output, fail once, reply
	for i, q := range queues {
		h := router.HandlerConfig{Name: fmt.Sprintf("h%02d", i), Queue: q, Concurrency: 2}
		switch i {
		case outputs:
			h.PublishTopic = queues[handlers-1]
		case replies:
			h.Reply = true
		}
		require.NoError(t, r.AddHandler(h, func(msg *message.Message) ([]*message.Message, error) {
			mu.Lock()
			defer mu.Unlock()
			if attempts[msg.UUID]++; i == retried && attempts[msg.UUID] == 1 {
				return nil, fmt.Errorf("the first attempt fails") // retried through the router's publisher
			}
			got[q]++
			switch i {
			case outputs, replies:
				return []*message.Message{message.NewMessage(msg.UUID+"-out", []byte("out"))}, nil
			}
			return nil, nil
		}))
	}
	start(t, r)
	for i, q := range queues {
		if i != replies {
			require.NoError(t, r.Publisher().Publish(q, message.NewMessage(q, nil)))
		}
	}
	client, err := rpc.NewClient(rpc.ClientConfig{Connection: env.Connection(), Timeout: 20 * time.Second}, env.Logger())
	require.NoError(t, err)
	defer client.Close()
	reply, err := client.Call(context.Background(), queues[replies], message.NewMessage("call", nil))
	require.NoError(t, err)
	assert.Equal(t, "out", string(reply.Payload))
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for i, q := range queues {
			want := 1
			if i == handlers-1 {
				want = 2 // its own message and h00's output
			}
			if got[q] != want {
				return false
			}
		}
		return true
	}, testenv.Patience(), 10*time.Millisecond, "every handler processed its messages, the output and the retry")

	opened := log.opened()
	total := 0
	for _, n := range opened {
		total += n
	}
	var onBroker []string
	require.Eventually(t, func() bool { // the management API lists a connection a moment after it opened
		onBroker = testenv.Connections(t, testenv.ManagementURL(), prefix)
		return len(onBroker) >= total
	}, testenv.Patience(), 100*time.Millisecond, "the broker lists the %d connections opened: %v", total, opened)
	t.Logf("a router with %d handlers: %d connections on the broker: %q", handlers, len(onBroker), onBroker)
	assert.LessOrEqual(t, len(onBroker), 3, "connections on the broker: %q", onBroker)
	assert.Equal(t, total, len(onBroker), "connections reported through OnEvent: %v", opened)
}

// stream publishes n messages to each of queues through r's publisher, one round every
// pace, and returns the ids published to each; it fails t on a failed publish.
func stream(t *testing.T, r *router.Router, queues []string, n int, pace time.Duration) map[string][]string {
	t.Helper()
	ids := map[string][]string{}
	tick := time.NewTicker(pace)
	defer tick.Stop()
	for i := range n {
		for _, q := range queues {
			id := fmt.Sprintf("%s-%d", q, i)
			require.NoError(t, r.Publisher().Publish(q, message.NewMessage(id, nil)))
			ids[q] = append(ids[q], id)
		}
		<-tick.C
	}
	return ids
}

// tally counts the messages each handler processed, by id.
type tally struct {
	mu   sync.Mutex
	seen map[string]int
}

func (c *tally) add(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen = map[string]int{}
	}
	c.seen[id]++
}

// missing returns how many of ids were not processed.
func (c *tally) missing(ids []string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, id := range ids {
		if c.seen[id] == 0 {
			n++
		}
	}
	return n
}

// The handlers of a router share its consuming connection, each on a channel of its own: one
// whose handler blocks, and one whose queue is deleted under it, stall none of the others,
// which process a stream meanwhile, and the connection is never lost.
func TestOneHandlersChannelStallsNoOther(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	var log connectionLog
	r := newRouter(t, env, func(c *router.Config) { c.Connection.OnEvent = log.add })
	slow, deleted := env.Queue("slow"), env.Queue("deleted")
	others := []string{env.Queue("a"), env.Queue("b"), env.Queue("c")}
	var done tally
	release := make(chan struct{})
	var blocked atomic.Int32
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: slow, Concurrency: 2}, func(msg *message.Message) error {
		blocked.Add(1)
		<-release
		done.add(msg.UUID)
		return nil
	}))
	for _, q := range append([]string{deleted}, others...) {
		require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: q, Concurrency: 4}, func(msg *message.Message) error {
			done.add(msg.UUID)
			return nil
		}))
	}
	runDone := start(t, r)
	unblock := sync.OnceFunc(func() { close(release) })
	defer unblock()

	stuck := stream(t, r, []string{slow}, 10, time.Millisecond) // 2 in its handler, 8 waiting
	require.Eventually(t, func() bool { return blocked.Load() == 2 }, testenv.Patience(), 5*time.Millisecond)
	ch := env.Channel()
	_, err := ch.QueueDelete(deleted, false, false, false)
	require.NoError(t, err)

	ids := stream(t, r, others, 100, 2*time.Millisecond)
	for _, q := range others {
		require.Eventually(t, func() bool { return done.missing(ids[q]) == 0 }, testenv.Patience(), 10*time.Millisecond,
			"%s: %d of %d not processed while another handler blocks and another queue is gone", q, done.missing(ids[q]), len(ids[q]))
	}
	assert.Equal(t, len(stuck[slow]), done.missing(stuck[slow]), "the blocked handler processed nothing")
	assert.Zero(t, log.count(warren.Reconnecting, "warren subscriber"), "the consuming connection was lost")
	assert.Equal(t, 1, log.count(warren.Connected, "warren subscriber"), "consuming connections opened")

	unblock()
	require.Eventually(t, func() bool { return done.missing(stuck[slow]) == 0 }, testenv.Patience(), 10*time.Millisecond)
	require.NoError(t, r.Close())
	err = <-runDone
	assert.ErrorContains(t, err, deleted, "Run reports the deleted queue")
}

// A handler whose consume the broker refuses with a connection error (541 INTERNAL_ERROR: its
// quorum queue is down) closes the router's consuming connection once, and retries on a
// connection of its own from then on: the other handlers go on processing a stream on the
// consuming connection, which is not lost again however often the refused one retries. On a
// throwaway node of its own.
func TestRefusedConsumerRetriesOnAConnectionOfItsOwn(t *testing.T) {
	t.Parallel()
	node := testenv.StartNode(t)
	env := testenv.NewAt(t, node.URL())
	var log connectionLog
	r := newRouter(t, env, func(c *router.Config) { c.Connection.OnEvent = log.add })
	down, up := env.Queue("down"), env.Queue("up")
	b, err := topology.NewBuilder(topology.Config{Delay: env.Delay(topology.Delay{})}, nil)
	require.NoError(t, err)
	require.NoError(t, b.Apply(t.Context(), env.Connection(), topology.Topology{Queues: []topology.Queue{{Name: down}}}))
	node.StopQueue(down)
	var done tally
	for _, q := range []string{down, up} {
		require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: q}, func(msg *message.Message) error {
			done.add(msg.UUID)
			return nil
		}))
	}
	runDone := make(chan error, 1)
	go func() { runDone <- r.Run(context.Background()) }() // never Running: one handler never consumes
	const isolated = "warren subscriber (isolated)"
	require.Eventually(t, func() bool { return log.count(warren.Connected, isolated) >= 1 }, testenv.Patience(), 10*time.Millisecond,
		"the refused consumer moved to a connection of its own")
	lostBefore := log.count(warren.Reconnecting, "warren subscriber")
	refusedBefore := log.count(warren.Reconnecting, isolated)

	ids := stream(t, r, []string{up}, 200, 10*time.Millisecond) // 2s: a few refusals on the isolated connection
	require.Eventually(t, func() bool { return done.missing(ids[up]) == 0 }, testenv.Patience(), 10*time.Millisecond,
		"%d of %d not processed", done.missing(ids[up]), len(ids[up]))
	refused := log.count(warren.Reconnecting, isolated) - refusedBefore
	t.Logf("consuming connection lost %d times (before the stream), the isolated one %d times during the stream",
		lostBefore, refused)
	assert.Equal(t, 1, lostBefore, "the first refusal closed the consuming connection")
	assert.GreaterOrEqual(t, refused, 2, "the refused consumer went on retrying, on its own connection")
	assert.Equal(t, lostBefore, log.count(warren.Reconnecting, "warren subscriber"), "the consuming connection was lost again")
	require.NoError(t, r.Close())
	t.Logf("Run after Close: %v", <-runDone) // the refused handler never consumed: an error or nil
}
