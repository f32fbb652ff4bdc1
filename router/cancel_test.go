package router_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/consumer"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// brokerCancelled is the subscriber's line for a consumer the broker cancelled.
const brokerCancelled = "The broker cancelled the consumer"

// serverVersion is the RabbitMQ version of env's broker.
func serverVersion(t *testing.T, env *testenv.Env) string {
	t.Helper()
	conn, err := env.Dial()
	require.NoError(t, err)
	defer conn.Close()
	v := amqpx.ServerVersion(conn)
	require.NotEmpty(t, v, "the broker announces its version")
	return v
}

// atLeast reports whether RabbitMQ version is major.minor or later.
func atLeast(t *testing.T, version string, major, minor int) bool {
	t.Helper()
	ma, mi, ok := amqpx.MajorMinor(version)
	require.True(t, ok, "version %q", version)
	return ma > major || ma == major && mi >= minor
}

// logged returns the lines of logs whose message starts with msg.
func logged(logs *orderedLogger, msg string) []logLine {
	var lines []logLine
	for _, l := range logs.snapshot() {
		if strings.HasPrefix(l.msg, msg) {
			lines = append(lines, l)
		}
	}
	return lines
}

// holder is a handler that holds the first delivery of the message "held" until release is
// closed, or fails it when its context ends first (as a handler that honours its context
// does), and counts every delivery by message UUID.
type holder struct {
	n           calls
	started     chan struct{}
	release     chan struct{}
	once        sync.Once
	mu          sync.Mutex
	redelivered []bool // of "held", in order
}

func newHolder() *holder {
	return &holder{started: make(chan struct{}), release: make(chan struct{})}
}

func (h *holder) handle(msg *message.Message) error {
	if h.n.add(msg.UUID) > 1 || msg.UUID != "held" {
		if msg.UUID == "held" {
			d, _ := warren.DeliveryFrom(msg.Context())
			h.mu.Lock()
			h.redelivered = append(h.redelivered, d.Redelivered)
			h.mu.Unlock()
		}
		return nil
	}
	h.once.Do(func() { close(h.started) })
	select {
	case <-h.release:
		return nil
	case <-msg.Context().Done():
		return msg.Context().Err()
	}
}

// A consumer the broker cancels while its channel stays open (RabbitMQ 4.3 so cancels a
// quorum queue's consumer past its consumer timeout; here the cancel is sent by a proxy, the
// broker's consumer stays) takes nothing more, lets the message it holds finish and acks it
// on that channel, then consumes again: the message is not delivered a second time, and the
// router keeps running.
func TestBrokerCancelSettlesTheMessagesInFlight(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("held")
	proxy, url := testenv.ProxyURL(t, env.URL)
	logs := &orderedLogger{}
	r, err := router.New(router.Config{
		Connection: warren.Connection{URL: url}, ShutdownTimeout: 20 * time.Second,
		Topology: topology.Config{Delay: env.Delay(topology.Delay{})},
	}, logs)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	h := newHolder()
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Name: "h", Queue: queue}, h.handle))
	done := start(t, r)
	pub := newPublisherFor(t, env)
	require.NoError(t, pub.Publish(queue, message.NewMessage("held", nil)))
	select {
	case <-h.started:
	case <-time.After(testenv.Patience()):
		t.Fatal("the message was not handed out")
	}

	require.Equal(t, 1, proxy.CancelConsumers("warren-h-"))
	// Heard the cancel, or (the defect) delivered the message again.
	require.Eventually(t, func() bool { return len(logged(logs, brokerCancelled)) > 0 || h.n.get("held") > 1 },
		testenv.Patience(), 10*time.Millisecond)
	close(h.release)
	require.NoError(t, pub.Publish(queue, message.NewMessage("after", nil)))
	require.Eventually(t, func() bool { return h.n.get("after") == 1 }, testenv.Patience(), 10*time.Millisecond,
		"consumed again after the cancel")
	select {
	case err := <-done:
		t.Fatalf("Run returned after a cancel: %v", err)
	default:
	}
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	assert.Equal(t, 1, h.n.get("held"), "acked on its channel, not delivered again")
	assert.Equal(t, 1, h.n.get("after"))
	assert.Zero(t, env.Messages(queue), "every message acked")
	assert.Len(t, logged(logs, brokerCancelled), 1)
}

// The broker cancels the consumer of a queue that is deleted; when the queue exists again by
// the time the subscriber hears the cancel (a proxy holds the cancel back while the queue is
// declared again), the subscriber consumes the new queue: it does not stop silently, nor for
// good. (The queue is declared again only once the broker has sent the cancel: a channel that
// learns of the deletion after the queue is back consumes it again by itself, without a
// cancel, as RabbitMQ 3.10.8's rabbit_channel:handle_consuming_queue_down_or_eol does.)
func TestCancelOfADeletedAndRedeclaredQueueConsumesAgain(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("redeclared")
	proxy, url := testenv.ProxyURL(t, env.URL)
	logs := &orderedLogger{}
	r, err := router.New(router.Config{
		Connection: warren.Connection{URL: url}, ShutdownTimeout: 10 * time.Second,
		Topology: topology.Config{Delay: env.Delay(topology.Delay{})},
	}, logs)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	var n calls
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Name: "h", Queue: queue}, func(msg *message.Message) error {
		n.add(msg.UUID)
		return nil
	}))
	done := start(t, r)
	pub := newPublisherFor(t, env)
	require.NoError(t, pub.Publish(queue, message.NewMessage("before", nil)))
	require.Eventually(t, func() bool { return n.get("before") == 1 }, testenv.Patience(), 10*time.Millisecond)

	proxy.Freeze()
	ch := env.Channel()
	_, err = ch.QueueDelete(queue, false, false, false)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return proxy.BrokerCancels() == 1 }, testenv.Patience(), 10*time.Millisecond,
		"the broker cancels the consumer of the deleted queue")
	b, err := topology.NewBuilder(topology.Config{Delay: env.Delay(topology.Delay{})}, nil)
	require.NoError(t, err)
	require.NoError(t, b.DeclareQueue(t.Context(), ch, topology.Queue{Name: queue}))
	proxy.Thaw()

	require.Eventually(t, func() bool { return len(logged(logs, brokerCancelled)) > 0 }, testenv.Patience(), 10*time.Millisecond,
		"the broker's basic.cancel reached the subscriber")
	require.NoError(t, pub.Publish(queue, message.NewMessage("after", nil)))
	require.Eventually(t, func() bool { return n.get("after") == 1 }, testenv.Patience(), 10*time.Millisecond,
		"the queue declared again is consumed")
	select {
	case err := <-done:
		t.Fatalf("Run returned: %v", err)
	default:
	}
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	assert.Equal(t, 1, n.get("before"))
	assert.Equal(t, 1, n.get("after"))
}

// A handler that holds a message past its queue's consumer timeout: the broker takes the
// message back and delivers it again, once; the handler gets it (redelivered), nothing is
// lost, and the router keeps running and consuming. The broker forces that one redelivery:
// the first handler holds the message until its copy has been handled.
//
// Per version: RabbitMQ 3.12 to 4.2 closes the channel (406 PRECONDITION_FAILED, "delivery
// acknowledgement ... timed out") and the copy is handled while the first handler runs; 4.3
// cancels the consumer and keeps the channel, and the subscriber waits for the first handler
// until ShutdownTimeout ends its context (it then fails the message), then consumes the
// copy. They check
// the timeout once a minute (channel_tick_interval, 60 s by default: the test takes a minute
// on 4.0.5). RabbitMQ 3.10 and 3.11 have no consumer timeout per queue, which warren refuses
// to declare (the broker would ignore it); their node-wide consumer_timeout is tested on a
// node of the test's own, set to 1 s and checked every 100 ms.
func TestConsumerTimeoutRedeliversTheMessageOnce(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	version := serverVersion(t, env)
	args := amqp.Table{"x-consumer-timeout": int64(1000)}
	delay := env.Delay(topology.Delay{})
	if !atLeast(t, version, 3, 12) {
		queue := env.Queue("ignored")
		_, err := router.New(router.Config{
			Connection: env.Connection(), Topology: topology.Config{Delay: delay},
			Declare: topology.Topology{Queues: []topology.Queue{{Name: queue, Args: args}}},
		}, env.Logger())
		require.ErrorContains(t, err, `Args["x-consumer-timeout"]`)
		require.ErrorContains(t, err, "RabbitMQ "+version+" ignores it")
		assert.False(t, queueExists(env, queue), "nothing declared")

		node := testenv.StartNode(t, testenv.WithRabbitSettings("{consumer_timeout, 1000}", "{channel_tick_interval, 100}"))
		env = testenv.NewAt(t, node.URL())
		version = serverVersion(t, env)
		args, delay = nil, topology.Delay{Levels: 1}
	}
	queue := env.Queue("held")
	logs := &orderedLogger{}
	r, err := router.New(router.Config{
		Connection: env.Connection(), ShutdownTimeout: 10 * time.Second,
		Topology: topology.Config{Delay: delay},
		Declare:  topology.Topology{Queues: []topology.Queue{{Name: queue, Args: args}}},
	}, logs)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	h := newHolder()
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Name: "h", Queue: queue}, h.handle))
	done := start(t, r)
	pub := newPublisherFor(t, env)
	require.NoError(t, pub.Publish(queue, message.NewMessage("held", nil)))
	select {
	case <-h.started:
	case <-time.After(testenv.Patience()):
		t.Fatal("the message was not handed out")
	}
	require.Eventually(t, func() bool { return h.n.get("held") == 2 }, 3*testenv.Patience(), 20*time.Millisecond,
		"the broker took the message back and delivered it again")
	close(h.release)
	require.NoError(t, pub.Publish(queue, message.NewMessage("after", nil)))
	require.Eventually(t, func() bool { return h.n.get("after") == 1 }, testenv.Patience(), 10*time.Millisecond,
		"consuming after the timeout")
	select {
	case err := <-done:
		t.Fatalf("Run returned after a consumer timeout: %v", err)
	default:
	}
	require.NoError(t, r.Close())
	require.NoError(t, <-done)

	assert.Equal(t, 2, h.n.get("held"), "the one redelivery the broker forces, no more")
	h.mu.Lock()
	assert.Equal(t, []bool{true}, h.redelivered, "the copy is marked redelivered")
	h.mu.Unlock()
	assert.Equal(t, 1, h.n.get("after"))
	assert.Zero(t, env.Messages(queue), "nothing lost, nothing left unacked")
	if atLeast(t, version, 4, 3) {
		assert.NotEmpty(t, logged(logs, brokerCancelled), "RabbitMQ %s cancels the consumer", version)
		return
	}
	var closedBy []string
	for _, l := range logged(logs, consumeFailed) {
		closedBy = append(closedBy, l.err)
	}
	require.NotEmpty(t, closedBy)
	assert.Contains(t, closedBy[0], "PRECONDITION_FAILED", "RabbitMQ %s closes the channel", version)
	assert.Contains(t, closedBy[0], "timed out")
	assert.Empty(t, logged(logs, brokerCancelled))
}

// The subscriber's own check: a quorum work queue with x-max-priority is refused before
// anything is declared, with what the broker's version offers instead; the broker refuses
// the argument itself on every version that runs here (3.10.8, 4.0.5).
func TestSubscriberRefusesMaxPriorityOnAQuorumQueue(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	version := serverVersion(t, env)
	queue := env.Queue("prio")
	sub, err := consumer.NewSubscriber(consumer.Config{
		Connection: env.Connection(), Topology: topology.Config{Delay: env.Delay(topology.Delay{})},
		Queues: []topology.Queue{{Name: queue, Args: amqp.Table{"x-max-priority": int64(5)}}},
	}, env.Logger())
	require.NoError(t, err, "the configuration alone does not say the broker's version")
	defer sub.Close()
	_, err = sub.Subscribe(context.Background(), queue)
	require.ErrorContains(t, err, "RabbitMQ "+version+" refuses it on a quorum queue")
	if atLeast(t, version, 4, 0) {
		assert.ErrorContains(t, err, "two levels")
	} else {
		assert.ErrorContains(t, err, "no priority before 4.0")
	}
	assert.NotContains(t, err.Error(), "gave up after", "refused at once, not retried")
	assert.False(t, queueExists(env, queue), "nothing declared")
}
