package router_test

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/consumer"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// calls counts handler calls per message id.
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) add(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
	return c.n[id]
}

func (c *calls) get(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

func publishRaw(t *testing.T, env *testenv.Env, exchange, key string, p amqp.Publishing) {
	t.Helper()
	ch := env.Channel()
	require.NoError(t, ch.Confirm(false))
	p.DeliveryMode = amqp.Persistent
	dc, err := ch.PublishWithDeferredConfirm(exchange, key, true, false, p)
	require.NoError(t, err)
	ok, err := dc.WaitContext(t.Context())
	require.NoError(t, err)
	require.True(t, ok)
}

// drain returns the messages of queue (acked) that it can get now, on a connection of its
// own: a get from a quorum queue that is still being declared fails with 541 noproc, which
// closes the connection; the caller's Eventually then calls drain again.
func drain(t *testing.T, env *testenv.Env, queue string) []amqp.Delivery {
	t.Helper()
	conn, err := env.Dial()
	if err != nil {
		t.Logf("drain %s: %v", queue, err)
		return nil
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Logf("drain %s: %v", queue, err)
		return nil
	}
	var out []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		if err != nil {
			t.Logf("drain %s: %v", queue, err) // what it got is acked: return it
			return out
		}
		if !ok {
			return out
		}
		out = append(out, d)
	}
}

// A message the handler returns that no queue takes (312 NO_ROUTE) can never be published:
// the input is poisoned at once, with the broker's reason, instead of being nacked and
// redelivered in a hot loop.
func TestUnroutableOutputIsPoisonedNotLooped(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue, events := env.Queue("in"), env.Exchange("events")
	r := newRouter(t, env, func(c *router.Config) { c.Route = dlx.ToExchange(events) })
	var n calls
	require.NoError(t, r.AddHandler(router.HandlerConfig{Queue: queue, PublishTopic: "nobody.listens"},
		func(msg *message.Message) ([]*message.Message, error) {
			n.add(msg.UUID)
			return []*message.Message{message.NewMessage(watermill.NewUUID(), msg.Payload)}, nil
		}))
	start(t, r)
	require.NoError(t, newPublisherFor(t, env).Publish(queue, message.NewMessage("m", []byte("x"))))
	d := poisoned(t, env, queue, testenv.Patience())
	assert.Equal(t, "m", d.MessageId)
	assert.Equal(t, warren.PoisonReasonPermanent, d.Headers[warren.PoisonReasonKey])
	assert.Contains(t, d.Headers[warren.PoisonErrorKey], "NO_ROUTE")
	assert.Never(t, func() bool { return n.get("m") > 1 }, time.Second, 20*time.Millisecond, "the input came back")
	assert.Equal(t, 1, n.get("m"), "handler calls")
}

// A failure to publish what the handler returns is a failure of the handler: retried on the
// schedule. Here the output queue is full (a classic one with x-max-length 1, reject-publish:
// the broker nacks; a quorum queue's limit is not exact) until the third attempt declares it
// again without a limit (making room by draining would race a copy of the second attempt's
// output that the broker takes late); the publisher gives up on a nacked message after its
// PublishTimeout.
func TestOutputPublishFailureIsRetriedOnTheSchedule(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue, out := env.Queue("in"), env.Queue("out")
	r := newRouter(t, env, func(c *router.Config) {
		c.Retry = middleware.BackoffConfig{Delays: []time.Duration{100 * time.Millisecond, 100 * time.Millisecond}}
		// A nacked attempt fails after PublishTimeout; the third one's confirm must come
		// within it, on a loaded machine too.
		c.PublishTimeout = 3 * time.Second
		// Declared here, and never by the publisher (which would declare it again on a new
		// connection, with its limit, once the handler has declared it without).
		c.Route = func(topic string) dlx.Route { return dlx.Route{RoutingKey: topic, Declared: true} }
		c.Declare.Queues = []topology.Queue{{Name: out, Type: topology.Classic,
			Args: amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"}}}
	})
	var (
		n        calls
		mu       sync.Mutex
		attempts []int
		drained  = make(chan struct{})
	)
	require.NoError(t, r.AddHandler(router.HandlerConfig{Queue: queue, PublishTopic: out},
		func(msg *message.Message) ([]*message.Message, error) {
			mu.Lock()
			attempts = append(attempts, middleware.Attempt(msg))
			mu.Unlock()
			if n.add(msg.UUID) == 3 { // room at last
				ch := env.Channel()
				_, err := ch.QueueDelete(out, false, false, false)
				assert.NoError(t, err)
				_, err = ch.QueueDeclare(out, true, false, false, false, nil)
				assert.NoError(t, err)
				close(drained)
			}
			return []*message.Message{message.NewMessage("o-"+msg.UUID, nil)}, nil
		}))
	start(t, r)
	require.NoError(t, r.Publisher().Publish(out, message.NewMessage("filler", nil)))
	require.NoError(t, newPublisherFor(t, env).Publish(queue, message.NewMessage("m", nil)))
	select {
	case <-drained:
	case <-time.After(testenv.Patience()):
		t.Fatalf("the third attempt did not come: %d calls", n.get("m"))
	}
	var got []amqp.Delivery
	require.Eventually(t, func() bool {
		got = append(got, drain(t, env, out)...)
		return len(got) > 0
	}, testenv.Patience(), 20*time.Millisecond)
	assert.Equal(t, "o-m", got[0].MessageId)
	assert.Never(t, func() bool { return n.get("m") > 3 }, 500*time.Millisecond, 10*time.Millisecond, "a fourth call came")
	assert.Equal(t, 3, n.get("m"), "one call per attempt of the schedule")
	mu.Lock()
	assert.Equal(t, []int{1, 2, 3}, attempts, "retries of the schedule, not redeliveries")
	mu.Unlock()
	assert.Zero(t, env.Messages(topology.PoisonQueue(queue)))
}

// Foreign or stale delay metadata never makes a forward fail or loop: the message a handler
// forwards as it received it goes at once, straight to its destination.
func TestForeignDelayMetadataIsNotADelay(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue, out := env.Queue("in"), env.Queue("out")
	r := newRouter(t, env, nil)
	var n calls
	require.NoError(t, r.AddHandler(router.HandlerConfig{Queue: queue, PublishTopic: out},
		func(msg *message.Message) ([]*message.Message, error) {
			n.add(msg.UUID)
			fwd := msg.Copy() // forwarded as received
			return []*message.Message{fwd}, nil
		}))
	start(t, r)
	foreign := map[string]amqp.Table{
		"until-2999":      {delay.DelayedUntilKey: "2999-01-01T00:00:00Z", delay.DelayedForKey: "1h"},
		"garbage-for":     {delay.DelayedForKey: "soon"},
		"garbage-delay":   {warren.MetadataDelay: "a while"},
		"deliver-at-past": {warren.MetadataDeliverAt: "2001-09-09T01:46:40Z"},
	}
	for id, h := range foreign {
		publishRaw(t, env, "", queue, amqp.Publishing{MessageId: id, Headers: h})
	}
	// Delayed by Watermill's own metadata, then forwarded: not delayed a second time.
	pub := newPublisherFor(t, env)
	m := message.NewMessage("delayed-once", nil)
	delay.Message(m, delay.For(300*time.Millisecond))
	require.NoError(t, pub.Publish(queue, m))

	got := map[string]amqp.Delivery{}
	require.Eventually(t, func() bool {
		for _, d := range drain(t, env, out) {
			got[d.MessageId] = d
		}
		return len(got) == len(foreign)+1
	}, testenv.Patience(), 20*time.Millisecond, "forwarded: %v", got)
	for id, d := range got {
		assert.Equal(t, "", d.Exchange, "%s went straight to its destination, not through the delay levels", id)
		assert.Equal(t, 1, n.get(id), "%s: handler calls", id)
	}
	assert.Zero(t, env.Messages(topology.PoisonQueue(queue)))
}

// A poison queue deleted under the router is declared again; the message is poisoned, not
// redelivered in a loop.
func TestDeletedPoisonQueueIsDeclaredAgain(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("in")
	r := newRouter(t, env, nil)
	var n calls
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(msg *message.Message) error {
		n.add(msg.UUID)
		return warren.Permanent(errors.New("never"))
	}))
	start(t, r)
	_, err := env.Channel().QueueDelete(topology.PoisonQueue(queue), false, false, false)
	require.NoError(t, err)
	publishRaw(t, env, "", queue, amqp.Publishing{MessageId: "m"}) // (a warren publisher would declare it)
	require.Eventually(t, func() bool {
		_, err := env.Inspect(topology.PoisonQueue(queue))
		return err == nil
	}, testenv.Patience(), 20*time.Millisecond, "the poison queue is declared again")
	d := poisoned(t, env, queue, testenv.Patience())
	assert.Equal(t, "m", d.MessageId)
	assert.Equal(t, 1, n.get("m"), "handler calls")
}

// A message whose retry would be too large for a frame is not retried as if the failure were
// transient (which closed the shared retry publisher's connection and disturbed unrelated
// messages): it is too large to poison as well, so it is rejected into the queue's
// dead-letter path, which leads to the poison queue. An unrelated message is handled once.
func TestTooLargeToRetryIsDeadLettered(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("in")
	r := newRouter(t, env, nil)
	var n calls
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(msg *message.Message) error {
		n.add(msg.UUID)
		if msg.UUID == "big" {
			return errors.New("fails")
		}
		return nil
	}))
	start(t, r)
	// 127,500 bytes: the broker takes it, a retry (with warren's headers) or poison copy does
	// not fit in a frame with room for the broker's headers.
	publishRaw(t, env, "", queue, amqp.Publishing{MessageId: "big", Headers: amqp.Table{"blob": strings.Repeat("x", 127500)}})
	for i := range 20 {
		publishRaw(t, env, "", queue, amqp.Publishing{MessageId: "small-" + strconv.Itoa(i)})
	}
	d := poisoned(t, env, queue, testenv.Patience())
	msg, err := warren.Marshaler{}.Unmarshal(d)
	require.NoError(t, err)
	assert.Equal(t, "big", msg.UUID)
	assert.Equal(t, warren.PoisonReasonRejected, warren.DecodePoisonRecord(msg.Metadata).Reason)
	handledOnce := func(pred func(calls int) bool) bool { // pred holds for big and every small one
		if !pred(n.get("big")) {
			return false
		}
		for i := range 20 {
			if !pred(n.get("small-" + strconv.Itoa(i))) {
				return false
			}
		}
		return true
	}
	require.Eventually(t, func() bool { return handledOnce(func(c int) bool { return c >= 1 }) }, testenv.Patience(),
		10*time.Millisecond, "the unrelated messages were not all handled")
	assert.Never(t, func() bool { return !handledOnce(func(c int) bool { return c == 1 }) }, 500*time.Millisecond,
		10*time.Millisecond, "a message was handled again")
	assert.Equal(t, 1, n.get("big"))
	for i := range 20 {
		assert.Equal(t, 1, n.get("small-"+strconv.Itoa(i)), "unrelated message %d", i)
	}
	assert.Zero(t, env.Messages(topology.PoisonQueue(queue)), "nothing else poisoned")
}

// A nacked message goes back to its queue after RequeueDelay, not at once: no hot loop.
func TestNackedMessageWaitsBeforeItComesBack(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("nacked")
	msgs := subscribe(t, env, queue, consumer.Config{RequeueDelay: 500 * time.Millisecond})
	publishRaw(t, env, "", queue, amqp.Publishing{MessageId: "m"})
	deliveries := 0
	deadline := time.After(2 * time.Second)
loop:
	for {
		select {
		case m := <-msgs:
			deliveries++
			m.Nack()
		case <-deadline:
			break loop
		}
	}
	// One every 500 ms: 4 or 5 in 2 s (thousands without the delay).
	assert.LessOrEqual(t, deliveries, 5)
	assert.GreaterOrEqual(t, deliveries, 2, "it does come back")
}

// A consumer the broker cancels while its queue still exists (basic.cancel: a classic queue's
// node went down; RabbitMQ 4.3 cancels a quorum consumer that timed out) consumes again; Run
// goes on.
func TestCancelledConsumerConsumesAgain(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("cancelled")
	proxy, url := testenv.ProxyURL(t, env.URL)
	r := newRouter(t, env, func(c *router.Config) { c.Connection.URL = url })
	var n calls
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Name: "h", Queue: queue}, func(msg *message.Message) error {
		n.add(msg.UUID)
		return nil
	}))
	done := start(t, r)
	pub := newPublisherFor(t, env)
	require.NoError(t, pub.Publish(queue, message.NewMessage("before", nil)))
	require.Eventually(t, func() bool { return n.get("before") == 1 }, testenv.Patience(), 10*time.Millisecond)

	require.Equal(t, 1, proxy.CancelConsumers("warren-h-"))
	require.NoError(t, pub.Publish(queue, message.NewMessage("after", nil)))
	require.Eventually(t, func() bool { return n.get("after") == 1 }, testenv.Patience(), 10*time.Millisecond,
		"consumed again after the cancel")
	select {
	case err := <-done:
		t.Fatalf("Run returned after a cancel: %v", err)
	default:
	}
}

// A queue really deleted under its handler ends the subscription, and Run returns an error
// naming the queue (never nil with work left undone).
func TestRunReportsADeletedQueue(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("deleted")
	r := newRouter(t, env, nil)
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(*message.Message) error { return nil }))
	done := start(t, r) // returns once the handler consumes
	_, err := env.Channel().QueueDelete(queue, false, false, false)
	require.NoError(t, err)
	select {
	case err := <-done:
		require.Error(t, err)
		assert.Contains(t, err.Error(), queue)
		assert.Contains(t, err.Error(), "deleted")
	case <-time.After(testenv.Patience()):
		t.Fatal("Run did not return")
	}
}

// At the hard stop of a shutdown, a handler that honours its context returns its
// cancellation: the message is neither retried nor poisoned, it goes back to its queue once.
func TestShutdownCancellationNeitherRetriesNorPoisons(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("shutdown")
	r := newRouter(t, env, func(c *router.Config) {
		c.ShutdownTimeout = time.Second
		c.Retry = middleware.BackoffConfig{Delays: []time.Duration{100 * time.Millisecond}}
	})
	started := make(chan struct{})
	var once sync.Once
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(msg *message.Message) error {
		once.Do(func() { close(started) })
		<-msg.Context().Done()
		return msg.Context().Err()
	}))
	done := start(t, r)
	require.NoError(t, newPublisherFor(t, env).Publish(queue, message.NewMessage("m", nil)))
	<-started
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	assert.Never(t, func() bool { // a retry (due 100ms later), had one been published, would arrive
		q, err := env.Inspect(queue)
		p, perr := env.Inspect(topology.PoisonQueue(queue))
		return err != nil || perr != nil || q.Messages > 1 || p.Messages > 0
	}, time.Second, 20*time.Millisecond, "a retry or a poison message came")
	got := drain(t, env, queue)
	require.Len(t, got, 1, "the message is back in its queue exactly once")
	assert.Equal(t, "m", got[0].MessageId)
	assert.NotContains(t, got[0].Headers, warren.AttemptKey, "not a retry")
	assert.Zero(t, env.Messages(topology.PoisonQueue(queue)), "not poisoned")
}

// warren's bookkeeping headers on a message from outside are dropped, not believed: a forged
// attempt count neither poisons at the first failure nor buys attempts, and forged origins
// and poison headers never reach the poison message. An attempt header out of range counts
// as attempt 1 even where it is believed (straight to the queue).
func TestForeignBookkeepingHeadersAreNotBelieved(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue, events := env.Queue("in"), env.Exchange("events")
	r := newRouter(t, env, func(c *router.Config) {
		c.Retry = middleware.BackoffConfig{Delays: []time.Duration{50 * time.Millisecond, 50 * time.Millisecond}}
	})
	var n calls
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue, Exchange: events, Keys: []string{"#"}},
		func(msg *message.Message) error {
			n.add(msg.UUID)
			return errors.New("fails")
		}))
	start(t, r)
	forged := amqp.Table{
		warren.AttemptKey:            "9223372036854775807",
		warren.OriginalExchangeKey:   "forged-exchange",
		warren.FirstFailureKey:       "1999-01-01T00:00:00Z",
		warren.PoisonStackKey:        "forged stack",
		contract.DestExchangeHeader:  "forged-dest",
		warren.OriginalRoutingKeyKey: "forged-key",
	}
	publishRaw(t, env, events, "order.created", amqp.Publishing{MessageId: "via-exchange", Headers: forged})
	two := amqp.Table{warren.AttemptKey: "2"}
	publishRaw(t, env, events, "order.created", amqp.Publishing{MessageId: "two-via-exchange", Headers: two})
	huge := amqp.Table{warren.AttemptKey: "9223372036854775807"}
	publishRaw(t, env, "", queue, amqp.Publishing{MessageId: "huge-direct", Headers: huge})

	poison := map[string]amqp.Delivery{}
	require.Eventually(t, func() bool {
		for _, d := range drain(t, env, topology.PoisonQueue(queue)) {
			poison[d.MessageId] = d
		}
		return len(poison) == 3
	}, testenv.Patience(), 20*time.Millisecond)
	for id, d := range poison {
		assert.Equal(t, 3, n.get(id), "%s: every attempt, no more", id)
		assert.Equal(t, "3", d.Headers[warren.PoisonAttemptsKey], id)
		assert.NotContains(t, d.Headers, warren.PoisonStackKey, id)
		assert.NotEqual(t, "1999-01-01T00:00:00Z", d.Headers[warren.PoisonFirstFailKey], id)
	}
	d := poison["via-exchange"]
	assert.Equal(t, events, d.Headers[warren.PoisonExchangeKey])
	assert.Equal(t, "order.created", d.Headers[warren.PoisonRoutingKeyKey])
	for k := range d.Headers { // (its own publish id is warren's)
		assert.False(t, contract.IsTransportHeader(k) && k != contract.PublishIDHeader, "transport header %s copied", k)
	}
}

// Messages whose headers the client cannot read are poisoned at once with a warren reason;
// the messages behind them are processed, and no handler sees the unreadable ones.
func TestUnreadableHeadersArePoisonedAndTheQueueFlows(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("hostile")
	r := newRouter(t, env, func(c *router.Config) {
		c.Declare.Queues = []topology.Queue{{Name: queue, Type: topology.Quorum}}
	})
	var n calls
	var handled atomic.Int32
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(msg *message.Message) error {
		n.add(msg.UUID)
		handled.Add(1)
		return nil
	}))
	start(t, r)
	hostile := env.InjectHostile(queue)
	for i := range 5 {
		publishRaw(t, env, "", queue, amqp.Publishing{MessageId: "normal-" + strconv.Itoa(i)})
	}
	require.Eventually(t, func() bool { return handled.Load() == 5 }, testenv.Patience(), 10*time.Millisecond)
	var got []amqp.Delivery
	require.Eventually(t, func() bool {
		got = append(got, drain(t, env, topology.PoisonQueue(queue))...)
		return len(got) == len(hostile)
	}, testenv.Patience(), 20*time.Millisecond)
	for _, d := range got {
		assert.Equal(t, warren.PoisonReasonUnreadable, d.Headers[warren.PoisonReasonKey], string(d.Body))
		assert.Contains(t, d.Headers[warren.PoisonErrorKey], "cannot read its headers", string(d.Body))
		assert.Contains(t, hostile, string(d.Body), "body kept")
	}
	assert.Zero(t, n.get("hostile"))
}

// A message the broker itself dead-lettered into a poison queue (past a quorum queue's
// delivery limit: its consumers kept dying while they held it) says why too.
func TestDeliveryLimitPoisonSaysWhy(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("limited")
	b, err := topology.NewBuilder(topology.Config{Delay: env.Delay(topology.Delay{})}, nil)
	require.NoError(t, err)
	require.NoError(t, b.DeclareQueue(t.Context(), env.Channel(), topology.Queue{Name: queue, Type: topology.Quorum, DeliveryLimit: 2}))
	publishRaw(t, env, "", queue, amqp.Publishing{MessageId: "m"})
	ch := env.Channel()
	for range 3 { // delivered, and the consumer "dies" (requeue) every time
		d, ok, err := ch.Get(queue, false)
		require.NoError(t, err)
		require.True(t, ok)
		require.NoError(t, d.Nack(false, true))
	}
	d := poisoned(t, env, queue, testenv.Patience())
	msg, err := warren.Marshaler{}.Unmarshal(d)
	require.NoError(t, err)
	assert.Equal(t, warren.PoisonReasonDeliveryLimit, warren.DecodePoisonRecord(msg.Metadata).Reason)
}

// A copy of a message that this subscriber acked already (the same publish: a publisher's
// re-send after a lost confirm, a redelivery after a lost ack) is acked without being
// handled again; a retry or a new publish of the same message id is handled.
func TestCopyOfAHandledPublishIsNotHandledAgain(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("copies")
	r := newRouter(t, env, func(c *router.Config) {
		c.Retry = middleware.BackoffConfig{Delays: []time.Duration{50 * time.Millisecond}}
	})
	var n calls
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(msg *message.Message) error {
		if n.add(msg.UUID) == 2 && msg.UUID == "fails-once" {
			return nil
		}
		if msg.UUID == "fails-once" {
			return errors.New("first attempt fails")
		}
		return nil
	}))
	start(t, r)
	copyOf := amqp.Publishing{MessageId: "m", Headers: amqp.Table{contract.PublishIDHeader: "p1"}}
	publishRaw(t, env, "", queue, copyOf)
	require.Eventually(t, func() bool { return n.get("m") == 1 }, testenv.Patience(), 10*time.Millisecond)
	publishRaw(t, env, "", queue, copyOf)                                                                               // a copy
	publishRaw(t, env, "", queue, amqp.Publishing{MessageId: "m", Headers: amqp.Table{contract.PublishIDHeader: "p2"}}) // a new publish
	pub := newPublisherFor(t, env)
	require.NoError(t, pub.Publish(queue, message.NewMessage("fails-once", nil)))
	require.Eventually(t, func() bool { return n.get("m") == 2 && n.get("fails-once") == 2 }, testenv.Patience(), 10*time.Millisecond)
	assert.Never(t, func() bool { return n.get("m") > 2 || n.get("fails-once") > 2 }, 300*time.Millisecond, 10*time.Millisecond,
		"the copy, or a retry of the retry, was handled")
	assert.Equal(t, 2, n.get("m"), "the copy is not handled, the new publish is")
	assert.Equal(t, 2, n.get("fails-once"), "its retry is a new publish")
	assert.Zero(t, env.Messages(queue))
}

// Copies of a failing message (a publisher's re-send after a lost confirm) make one chain of
// attempts, not one each: a copy that arrives while its twin is handled is acked at once,
// and the retries of both copies are copies of each other.
func TestCopiesOfAFailingMessageMakeOneChain(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("copies")
	r := newRouter(t, env, func(c *router.Config) {
		c.Retry = middleware.BackoffConfig{Delays: []time.Duration{50 * time.Millisecond, 50 * time.Millisecond}}
	})
	var n calls
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(msg *message.Message) error {
		n.add(msg.UUID)
		time.Sleep(100 * time.Millisecond) // simulates work: the copy arrives while this one is handled
		return errors.New("always fails")
	}))
	start(t, r)
	twin := amqp.Publishing{MessageId: "m", Headers: amqp.Table{contract.PublishIDHeader: "f1"}}
	publishRaw(t, env, "", queue, twin)
	publishRaw(t, env, "", queue, twin)
	d := poisoned(t, env, queue, testenv.Patience())
	assert.Equal(t, "m", d.MessageId)
	assert.Never(t, func() bool {
		p, err := env.Inspect(topology.PoisonQueue(queue))
		return n.get("m") > 3 || err != nil || p.Messages > 0
	}, 500*time.Millisecond, 10*time.Millisecond, "a fourth call, or a second poison message")
	assert.Equal(t, 3, n.get("m"), "one call per attempt, MaxAttempts 3")
	assert.Zero(t, env.Messages(topology.PoisonQueue(queue)), "poisoned once")
}
