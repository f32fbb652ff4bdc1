package router_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/consumer"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/handlers"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// newRouter returns a router on env's broker with delay levels of the test's own; it is
// closed when the test ends.
func newRouter(t *testing.T, env *testenv.Env, mod func(*router.Config)) *router.Router {
	t.Helper()
	cfg := router.Config{
		Connection:      env.Connection(),
		ShutdownTimeout: 10 * time.Second,
		Topology:        topology.Config{Delay: env.Delay(topology.Delay{})},
	}
	if mod != nil {
		mod(&cfg)
	}
	r, err := router.New(cfg, env.Logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// subscribe consumes queue with a Subscriber of cfg on env's broker and delay levels, closed
// when the test ends.
func subscribe(t *testing.T, env *testenv.Env, queue string, cfg consumer.Config) <-chan *message.Message {
	t.Helper()
	cfg.Connection, cfg.Topology = env.Connection(), topology.Config{Delay: env.Delay(topology.Delay{})}
	sub, err := consumer.NewSubscriber(cfg, env.Logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	msgs, err := sub.Subscribe(context.Background(), queue)
	require.NoError(t, err)
	return msgs
}

// start runs r until the test ends and returns once its handlers run.
func start(t *testing.T, r *router.Router) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case <-r.Running():
	case err := <-done:
		t.Fatalf("router stopped at once: %v", err)
	case <-time.After(testenv.Patience()):
		t.Fatal("router did not start")
	}
	return done
}

// poisoned waits for one message in queue's poison queue. It gets on a connection of its
// own: a get from a quorum queue that is still being declared (again) fails with 541 noproc,
// which closes the connection; it then connects again.
func poisoned(t *testing.T, env *testenv.Env, queue string, timeout time.Duration) amqp.Delivery {
	t.Helper()
	var (
		mu    sync.Mutex
		conns []*amqp.Connection
		conn  *amqp.Connection
		ch    *amqp.Channel
		d     amqp.Delivery
	)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var err error
		if conn == nil || conn.IsClosed() {
			conn, err = env.Dial()
			require.NoError(c, err)
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
		if ch == nil || ch.IsClosed() {
			ch, err = conn.Channel()
			require.NoError(c, err)
		}
		got, ok, err := ch.Get(topology.PoisonQueue(queue), true)
		require.NoError(c, err)
		require.True(c, ok, "nothing in %s within %s", topology.PoisonQueue(queue), timeout)
		d = got
	}, timeout, 20*time.Millisecond)
	return d
}

type orderError struct{ id string }

func (e *orderError) Error() string { return "order " + e.id + " is not payable" }

type attempt struct {
	n       int
	at      time.Time
	handler string
}

// A failing handler is tried at the times its schedule gives (never early), as many times
// as the limit allows; then the message is in the poison queue with every header, and one
// trace covers publish, every retry and the poison message.
func TestRetryScheduleLimitPoisonHeadersAndTrace(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	events, queue := env.Exchange("events"), env.Queue("payments")
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	delays := []time.Duration{300 * time.Millisecond, 700 * time.Millisecond, 1200 * time.Millisecond}
	r := newRouter(t, env, func(c *router.Config) {
		c.Route = dlx.ToExchange(events)
		c.TracerProvider = tp
		c.Retry = middleware.BackoffConfig{Delays: delays}
	})

	var (
		mu       sync.Mutex
		attempts []attempt
	)
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{
		Name: "pay", Queue: queue, Exchange: events, Keys: []string{"order.*"},
	}, func(msg *message.Message) error {
		mu.Lock()
		attempts = append(attempts, attempt{middleware.Attempt(msg), time.Now(), message.HandlerNameFromCtx(msg.Context())})
		mu.Unlock()
		return fmt.Errorf("charging card: %w", &orderError{id: "o-1"})
	}))
	start(t, r)

	ctx, root := tp.Tracer("test").Start(context.Background(), "checkout")
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"id":"o-1"}`))
	msg.Metadata.Set("tenant", "acme")
	msg.SetContext(ctx)
	require.NoError(t, r.Publisher().Publish("order.created", msg))
	root.End()

	d := poisoned(t, env, queue, testenv.Patience())
	assert.Never(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts) > 4
	}, 500*time.Millisecond, 10*time.Millisecond, "a fifth attempt came")
	mu.Lock()
	got := append([]attempt(nil), attempts...)
	mu.Unlock()

	require.Len(t, got, 4, "the limit is 4 attempts")
	for i, a := range got {
		assert.Equal(t, i+1, a.n)
		assert.Equal(t, "pay", a.handler)
		if i > 0 {
			wait := a.at.Sub(got[i-1].at)
			assert.GreaterOrEqual(t, wait, delays[i-1], "attempt %d came early", a.n)
			t.Logf("attempt %d: %s after attempt %d (schedule %s)", a.n, wait.Round(time.Millisecond), i, delays[i-1])
		}
	}

	h := d.Headers
	assert.Equal(t, msg.UUID, d.MessageId)
	assert.Equal(t, `{"id":"o-1"}`, string(d.Body))
	assert.Equal(t, "acme", h["tenant"], "the message's own headers are kept")
	assert.Equal(t, "charging card: order o-1 is not payable", h[warren.PoisonErrorKey])
	assert.Equal(t, "*router_test.orderError", h[warren.PoisonErrorTypeKey])
	assert.Equal(t, warren.PoisonReasonExhausted, h[warren.PoisonReasonKey])
	assert.Equal(t, "pay", h[warren.PoisonHandlerKey])
	assert.Equal(t, queue, h[warren.PoisonQueueKey])
	assert.Equal(t, events, h[warren.PoisonExchangeKey])
	assert.Equal(t, "order.created", h[warren.PoisonRoutingKeyKey])
	assert.Equal(t, "4", h[warren.PoisonAttemptsKey])
	first, err := time.Parse(time.RFC3339Nano, h[warren.PoisonFirstFailKey].(string))
	require.NoError(t, err)
	last, err := time.Parse(time.RFC3339Nano, h[warren.PoisonLastFailKey].(string))
	require.NoError(t, err)
	assert.True(t, !first.Before(got[0].at.Truncate(time.Millisecond)) && first.Before(got[1].at), "first failure %s: after attempt 1 (%s), before attempt 2", first, got[0].at)
	assert.True(t, !last.Before(got[3].at.Truncate(time.Millisecond)), "last failure %s: after attempt 4 (%s)", last, got[3].at)
	assert.Equal(t, root.SpanContext().TraceID().String(), h[warren.PoisonTraceIDKey])

	// One trace: the root, 1 publish, 4 processings, 3 retry publishes, 1 poison publish.
	require.NoError(t, tp.ForceFlush(context.Background()))
	var process, send []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		assert.Equal(t, root.SpanContext().TraceID(), s.SpanContext().TraceID(), "span %s", s.Name())
		switch s.SpanKind() {
		case trace.SpanKindConsumer:
			process = append(process, s)
		case trace.SpanKindProducer:
			send = append(send, s)
		}
	}
	require.Len(t, process, 4)
	require.Len(t, send, 5)
	sort.Slice(process, func(i, j int) bool { return process[i].StartTime().Before(process[j].StartTime()) })
	for i, s := range process {
		attrs := attrMap(s.Attributes())
		assert.Equal(t, "rabbitmq", attrs["messaging.system"])
		assert.Equal(t, queue, attrs["messaging.destination.name"])
		key := "order.created" // retries are delivered straight to the queue
		if i > 0 {
			key = queue
		}
		assert.Equal(t, key, attrs["messaging.rabbitmq.destination.routing_key"])
		assert.Equal(t, msg.UUID, attrs["messaging.message.id"])
		assert.Equal(t, int64(i+1), attrs["warren.attempt"])
		assert.Equal(t, "process "+queue, s.Name())
	}
	sendDest := map[string]int{}
	for _, s := range send {
		sendDest[attrMap(s.Attributes())["messaging.destination.name"].(string)]++
	}
	assert.Equal(t, map[string]int{"order.created": 1, queue: 3, topology.PoisonQueue(queue): 1}, sendDest)
}

func attrMap(kvs []attribute.KeyValue) map[string]any {
	m := map[string]any{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

// In a fan-out topic, a retry goes to the failing group's queue only.
func TestRetryInFanOutReachesOnlyTheFailingGroup(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	events := env.Exchange("events")
	failing, other := env.Queue("billing"), env.Queue("audit")
	r := newRouter(t, env, func(c *router.Config) {
		c.Route = dlx.ToExchange(events)
		c.Retry = middleware.BackoffConfig{Delays: []time.Duration{200 * time.Millisecond}}
	})
	var billing, audit atomic.Int32
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: failing, Exchange: events, Keys: []string{"order.*"}},
		func(msg *message.Message) error {
			if billing.Add(1) == 1 {
				return errors.New("try again")
			}
			return nil
		}))
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: other, Exchange: events, Keys: []string{"order.*"}},
		func(msg *message.Message) error { audit.Add(1); return nil }))
	start(t, r)

	require.NoError(t, r.Publisher().Publish("order.created", message.NewMessage(watermill.NewUUID(), nil)))
	require.Eventually(t, func() bool { return billing.Load() == 2 }, testenv.Patience(), 20*time.Millisecond)
	assert.Never(t, func() bool { return billing.Load() > 2 || audit.Load() > 1 }, 500*time.Millisecond, 10*time.Millisecond,
		"a third attempt, or the retry in the other group")
	assert.EqualValues(t, 2, billing.Load(), "the failing group: first attempt and its retry")
	assert.EqualValues(t, 1, audit.Load(), "the other group never sees the retry")
	assert.Zero(t, env.Messages(topology.PoisonQueue(failing)))
}

func TestPanicIsRetriedThenPoisoned(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("panics")
	r := newRouter(t, env, func(c *router.Config) {
		c.Retry = middleware.BackoffConfig{Delays: []time.Duration{100 * time.Millisecond}}
	})
	var calls atomic.Int32
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(msg *message.Message) error {
		calls.Add(1)
		var m map[string]int
		m["boom"]++ //nolint:staticcheck // a nil map: the runtime panic this test is about
		return nil
	}))
	start(t, r)
	require.NoError(t, r.Publisher().Publish(queue, message.NewMessage(watermill.NewUUID(), nil)))

	d := poisoned(t, env, queue, testenv.Patience())
	assert.EqualValues(t, 2, calls.Load())
	assert.Equal(t, "*middleware.PanicError", d.Headers[warren.PoisonErrorTypeKey])
	assert.Contains(t, d.Headers[warren.PoisonErrorKey], "assignment to entry in nil map")
	assert.Contains(t, d.Headers[warren.PoisonStackKey], "router_test.TestPanicIsRetriedThenPoisoned")
	assert.Equal(t, "2", d.Headers[warren.PoisonAttemptsKey])
}

type payment struct {
	Amount int `json:"amount"`
}

// A payload that cannot be decoded is permanent: poisoned at once, without retries.
func TestUndecodableJSONIsPoisonedAtOnce(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("json")
	r := newRouter(t, env, func(c *router.Config) {
		c.Retry = middleware.BackoffConfig{Delays: []time.Duration{100 * time.Millisecond}}
	})
	var decoded atomic.Int32
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue},
		handlers.JSON(func(ctx context.Context, p payment) error { decoded.Add(1); return nil })))
	start(t, r)
	require.NoError(t, r.Publisher().Publish(queue, message.NewMessage(watermill.NewUUID(), []byte(`{"amount":`))))

	d := poisoned(t, env, queue, testenv.Patience())
	assert.Equal(t, warren.PoisonReasonPermanent, d.Headers[warren.PoisonReasonKey])
	assert.Equal(t, "1", d.Headers[warren.PoisonAttemptsKey])
	assert.Equal(t, "*json.SyntaxError", d.Headers[warren.PoisonErrorTypeKey])
	assert.Zero(t, decoded.Load())
	assert.Zero(t, env.Messages(queue), "no retry is waiting")
}

// N handlers of one router are in flight at once: each waits until all N are.
func TestHandlersRunConcurrently(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("concurrent")
	const n = 8
	r := newRouter(t, env, nil)
	var (
		inflight, peak atomic.Int32
		all            = make(chan struct{})
		once           sync.Once
	)
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue, Concurrency: n}, func(msg *message.Message) error {
		now := inflight.Add(1)
		defer inflight.Add(-1)
		for {
			p := peak.Load()
			if now <= p || peak.CompareAndSwap(p, now) {
				break
			}
		}
		if now == n {
			once.Do(func() { close(all) })
		}
		select {
		case <-all:
			return nil
		case <-time.After(testenv.Patience()):
			return warren.Permanent(errors.New("not all handlers were in flight at once"))
		}
	}))
	start(t, r)
	var msgs []*message.Message
	for range n {
		msgs = append(msgs, message.NewMessage(watermill.NewUUID(), nil))
	}
	require.NoError(t, r.Publisher().Publish(queue, msgs...))
	select {
	case <-all:
	case <-time.After(testenv.Patience()):
		t.Fatalf("only %d of %d handlers were in flight at once", peak.Load(), n)
	}
	assert.EqualValues(t, n, peak.Load())
}

// Closing under load: what was processed was processed once and acked, the rest is back in
// the queue; a second router processes exactly the rest.
func TestGracefulShutdownLosesAndDuplicatesNothing(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("load")
	const total = 1000
	var (
		mu    sync.Mutex
		count = map[string]int{}
	)
	handler := func(msg *message.Message) error {
		time.Sleep(time.Duration(1+len(msg.UUID)%5) * time.Millisecond) // simulates work
		mu.Lock()
		count[msg.UUID]++
		mu.Unlock()
		return nil
	}
	processed := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(count)
	}

	pub := newPublisherFor(t, env)
	var msgs []*message.Message
	for i := range total {
		msgs = append(msgs, message.NewMessage(strconv.Itoa(i), nil))
	}
	require.NoError(t, pub.Publish(queue, msgs...))

	first := newRouter(t, env, func(c *router.Config) { c.Concurrency = 16 })
	require.NoError(t, first.AddConsumerHandler(router.HandlerConfig{Queue: queue}, handler))
	done := start(t, first)
	require.Eventually(t, func() bool { return processed() >= 200 }, testenv.Patience(), 5*time.Millisecond)
	require.NoError(t, first.Close())
	require.NoError(t, <-done)

	afterFirst := processed()
	ready := func() int {
		q, err := env.Inspect(queue)
		if err != nil {
			return -1
		}
		return q.Messages
	}
	// The broker puts the deliveries of the closed channel back in the queue on its own time:
	// on a loaded broker, the first count after Close can miss some.
	assert.Eventually(t, func() bool { return afterFirst+ready() == total }, testenv.Patience(), 20*time.Millisecond,
		"processed + in the queue = published")
	t.Logf("first router processed %d, %d back in the queue", afterFirst, ready())
	assert.Less(t, afterFirst, total, "closed before the end")

	second := newRouter(t, env, func(c *router.Config) { c.Concurrency = 16 })
	require.NoError(t, second.AddConsumerHandler(router.HandlerConfig{Queue: queue}, handler))
	start(t, second)
	require.Eventually(t, func() bool { return processed() == total }, testenv.Patience(), 10*time.Millisecond)
	assert.Never(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, n := range count {
			if n > 1 {
				return true
			}
		}
		return false
	}, 200*time.Millisecond, 10*time.Millisecond, "a message was processed twice")
	mu.Lock()
	defer mu.Unlock()
	for id, n := range count {
		if n != 1 {
			t.Errorf("message %s processed %d times", id, n)
		}
	}
	assert.Len(t, count, total)
}

func newPublisherFor(t *testing.T, env *testenv.Env) *dlx.Publisher {
	p, err := dlx.NewPublisher(dlx.Config{Connection: env.Connection(), Topology: topology.Config{Delay: env.Delay(topology.Delay{})}}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// A delivery the marshaler cannot unmarshal goes to the poison queue with the reason; the
// others are handed out.
func TestUndecodableDeliveryIsPoisoned(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("undecodable")
	msgs := subscribe(t, env, queue, consumer.Config{Marshaler: pickyMarshaler{}, HandlerName: "picky"})

	ch := env.Channel()
	require.NoError(t, ch.Publish("", queue, false, false, amqp.Publishing{MessageId: "bad", Body: []byte("x"), Headers: amqp.Table{"encoding": "rot13"}}))
	require.NoError(t, ch.Publish("", queue, false, false, amqp.Publishing{MessageId: "good", Body: []byte("y")}))
	select {
	case m := <-msgs:
		assert.Equal(t, "good", m.UUID)
		m.Ack()
	case <-time.After(testenv.Patience()):
		t.Fatal("the good message was not handed out")
	}
	d := poisoned(t, env, queue, testenv.Patience())
	assert.Equal(t, "bad", d.MessageId)
	assert.Equal(t, warren.PoisonReasonUndecoded, d.Headers[warren.PoisonReasonKey])
	assert.Equal(t, "unmarshal: unknown encoding rot13", d.Headers[warren.PoisonErrorKey])
	assert.Equal(t, "picky", d.Headers[warren.PoisonHandlerKey])
	assert.Equal(t, "x", string(d.Body))
}

type pickyMarshaler struct{ warren.Marshaler }

func (m pickyMarshaler) Unmarshal(d amqp.Delivery) (*message.Message, error) {
	if e, ok := d.Headers["encoding"]; ok {
		return nil, fmt.Errorf("unknown encoding %v", e)
	}
	return m.Marshaler.Unmarshal(d)
}

func TestConfigErrorsNameTheField(t *testing.T) {
	_, err := router.New(router.Config{}, nil)
	assert.ErrorContains(t, err, "Config.Connection.URL")
	_, err = router.New(router.Config{Connection: warren.Connection{URL: "amqp://x/"}, Concurrency: -1}, nil)
	assert.ErrorContains(t, err, "Config.Concurrency")
	_, err = consumer.NewSubscriber(consumer.Config{Connection: warren.Connection{URL: "amqp://x/"}, Concurrency: 70000}, nil)
	assert.ErrorContains(t, err, "Concurrency")
	_, err = router.New(router.Config{Connection: warren.Connection{URL: "amqp://x/"}, Topology: topology.Config{QueueType: topology.Classic},
		Declare: topology.Topology{Queues: []topology.Queue{{Name: "q", DeliveryLimit: 3}}}}, nil)
	assert.ErrorContains(t, err, `router: Config.Declare: topology: Queues[0].DeliveryLimit 3: queue "q" is classic`)
	_, err = middleware.NewBackoff(middleware.BackoffConfig{}, nil)
	assert.ErrorContains(t, err, "BackoffConfig.Publisher")
	_, err = middleware.NewBackoff(middleware.BackoffConfig{Publisher: nopPublisher{}, Delays: []time.Duration{-time.Second}}, nil)
	assert.ErrorContains(t, err, "BackoffConfig.Delays[0]")
}

type nopPublisher struct{}

func (nopPublisher) Publish(string, ...*message.Message) error { return nil }
func (nopPublisher) Close() error                              { return nil }

// SIGTERM stops Run gracefully: the message in flight is finished and acked.
func TestSignalStopsRunGracefully(t *testing.T) {
	// Not parallel: it sends SIGTERM to the whole test process.
	env := testenv.Logic(t)
	queue := env.Queue("signal")
	r := newRouter(t, env, func(c *router.Config) { c.HandleSignals = true })
	started, finished := make(chan struct{}), make(chan struct{})
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(msg *message.Message) error {
		close(started)
		time.Sleep(300 * time.Millisecond) // simulates work: the message is in flight when SIGTERM comes
		close(finished)
		return nil
	}))
	done := start(t, r)
	require.NoError(t, r.Publisher().Publish(queue, message.NewMessage(watermill.NewUUID(), nil)))
	<-started
	require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGTERM))
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(testenv.Patience()):
		t.Fatal("Run did not return after SIGTERM")
	}
	select {
	case <-finished:
	default:
		t.Fatal("Run returned before the handler in flight finished")
	}
	assert.Zero(t, env.Messages(queue), "acked, not returned to the queue")
}

// A queue deleted under a consumer stops that subscription: no empty message is handed out
// and the queue is not declared again (watermill-amqp does both).
func TestDeletedQueueStopsTheSubscription(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("deleted")
	sub, err := consumer.NewSubscriber(consumer.Config{Connection: env.Connection(), Topology: topology.Config{Delay: env.Delay(topology.Delay{})}}, env.Logger())
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), queue)
	require.NoError(t, err)
	select {
	case <-sub.Ready(): // consuming
	case <-time.After(testenv.Patience()):
		t.Fatal("the subscription did not start consuming")
	}

	_, err = env.Channel().QueueDelete(queue, false, false, false)
	require.NoError(t, err)
	select {
	case m, ok := <-msgs:
		require.False(t, ok, "a message was handed out: %v", m)
	case <-time.After(testenv.Patience()):
		t.Fatal("the subscription did not stop")
	}
	assert.Never(t, func() bool { return queueExists(env, queue) }, 300*time.Millisecond, 20*time.Millisecond,
		"the queue was declared again")
	_, err = env.Channel().QueueDeclarePassive(queue, true, false, false, false, nil)
	assert.ErrorContains(t, err, "NOT_FOUND")
}

// A router that ran, published, retried and closed leaves no goroutine behind; nor do a
// subscriber and a publisher on their own.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	// Not parallel: goleak sees the goroutines of every test running.
	env := testenv.Logic(t)
	queue := env.Queue("leak")
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	r := newRouter(t, env, func(c *router.Config) {
		c.Retry = middleware.BackoffConfig{Delays: []time.Duration{50 * time.Millisecond}}
	})
	var calls atomic.Int32
	done := make(chan struct{})
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(*message.Message) error {
		if calls.Add(1) == 1 {
			return errors.New("once")
		}
		close(done)
		return nil
	}))
	stopped := start(t, r)
	require.NoError(t, r.Publisher().Publish(queue, message.NewMessage(watermill.NewUUID(), nil)))
	<-done
	require.NoError(t, r.Close())
	require.NoError(t, <-stopped)
}

// queueExists tells whether queue exists, on a channel of its own (a passive declare of a
// queue that does not exist closes its channel).
func queueExists(env *testenv.Env, queue string) bool {
	_, err := env.Inspect(queue)
	return err == nil
}
