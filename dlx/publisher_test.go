package dlx_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// declaring lets two tests at a time declare their delay levels: more at once can take a
// small broker longer than the ConnectTimeout (see docs/decisions.md, "dlx's tests under
// load").
var declaring = make(chan struct{}, 2)

// oneOfFewDeclaring runs declare while at most one other test declares its levels.
func oneOfFewDeclaring(declare func()) {
	declaring <- struct{}{}
	defer func() { <-declaring }()
	declare()
}

// newPublisher starts a publisher with delay levels of the test's own, testenv's light
// layout (17 queues) unless mod sets another: radix16 for the tests of the default radix's
// digits.
func newPublisher(t *testing.T, env *testenv.Env, mod func(*dlx.Config)) *dlx.Publisher {
	t.Helper()
	cfg := dlx.Config{Connection: env.Connection(), Topology: topology.Config{Delay: env.Delay(topology.Delay{})}}
	if mod != nil {
		mod(&cfg)
	}
	var (
		p   *dlx.Publisher
		err error
	)
	oneOfFewDeclaring(func() { p, err = dlx.NewPublisher(cfg, env.Logger()) })
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// radix16 gives a publisher 4 levels of the default radix 16 (60 queues, delays up to
// 65.5 s): each delay takes up to 4 hops, with digits up to 15.
func radix16(env *testenv.Env) func(*dlx.Config) {
	return func(c *dlx.Config) {
		c.Topology.Delay = env.Delay(topology.Delay{Radix: topology.DefaultDelayRadix, Levels: 4})
	}
}

type arrival struct {
	msg *message.Message
	at  time.Time
	d   amqp.Delivery
}

// consume reads queue until n messages arrived, for up to testenv.Patience.
func consume(t *testing.T, env *testenv.Env, queue string, n int) []arrival {
	t.Helper()
	ch := env.Channel()
	defer ch.Close() // cancels the consumer: later calls get the later messages
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	require.NoError(t, err)
	var got []arrival
	timeout := testenv.Patience()
	deadline := time.After(timeout)
	for len(got) < n {
		select {
		case d := <-deliveries:
			at := time.Now()
			msg, err := warren.Marshaler{}.Unmarshal(d)
			require.NoError(t, err)
			got = append(got, arrival{msg, at, d})
		case <-deadline:
			env.LogDepths() // where they are: the delay levels, the parking queue?
			t.Fatalf("queue %s: %d of %d messages arrived within %s", queue, len(got), n, timeout)
		}
	}
	return got
}

func TestPublishImmediate(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("orders")
	p := newPublisher(t, env, nil)

	msg := message.NewMessage(watermill.NewUUID(), []byte("hello"))
	msg.Metadata.Set("tenant", "acme")
	require.NoError(t, p.Publish(q, msg))

	got := consume(t, env, q, 1)
	assert.Equal(t, msg.UUID, got[0].msg.UUID)
	assert.Equal(t, msg.UUID, got[0].d.MessageId)
	assert.Equal(t, "hello", string(got[0].msg.Payload))
	assert.Equal(t, "acme", got[0].msg.Metadata.Get("tenant"))
	assert.Equal(t, uint8(amqp.Persistent), got[0].d.DeliveryMode)
}

// Delays published in any order arrive none early, and a long delay published first does not
// hold back the short ones published after it: they all arrive before it is due (head-of-line
// blocking would hold them for its whole delay). Their order among themselves is not checked:
// on a loaded machine their lateness differs by seconds, as each takes its own path through
// the levels.
func TestMixedDelaysNoHeadOfLineBlocking(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.Queue("mixed")
	p := newPublisher(t, env, radix16(env))

	long := message.NewMessage("long", nil)
	warren.Delay(long, time.Minute)
	longDue := time.Now().Add(time.Minute)
	require.NoError(t, p.Publish(q, long))
	delays := []time.Duration{3 * time.Second, 1500 * time.Millisecond, 10 * time.Millisecond,
		2500 * time.Millisecond, 300 * time.Millisecond, 2 * time.Second, 700 * time.Millisecond, 1100 * time.Millisecond}
	due := map[string]time.Time{}
	for _, d := range delays {
		msg := message.NewMessage(d.String(), nil)
		warren.Delay(msg, d)
		due[msg.UUID] = time.Now().Add(d)
		require.NoError(t, p.Publish(q, msg))
	}

	got := consume(t, env, q, len(delays))
	for _, a := range got {
		assert.NotEqual(t, "long", a.msg.UUID, "the long delay arrived before the short ones")
		assert.False(t, a.at.Before(due[a.msg.UUID]), "%s arrived %s early", a.msg.UUID, due[a.msg.UUID].Sub(a.at))
		assert.True(t, a.at.Before(longDue), "%s held back until the long delay was due", a.msg.UUID)
		t.Logf("%s: %s late", a.msg.UUID, a.at.Sub(due[a.msg.UUID]).Round(time.Millisecond))
	}
}

// Many random delays, published concurrently: none arrives before it is due.
func TestNeverEarly(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("early")
	p := newPublisher(t, env, radix16(env))

	const n = 400
	var (
		mu  sync.Mutex
		due = map[string]time.Time{}
		wg  sync.WaitGroup
	)
	for w := range 8 {
		wg.Go(func() {
			for i := range n / 8 {
				d := time.Duration(rand.Int64N(int64(1500*time.Millisecond))) + time.Microsecond
				msg := message.NewMessage(fmt.Sprintf("%d-%d", w, i), nil)
				warren.Delay(msg, d)
				mu.Lock()
				due[msg.UUID] = time.Now().Add(d)
				mu.Unlock()
				assert.NoError(t, p.Publish(q, msg))
			}
		})
	}
	wg.Wait()
	got := consume(t, env, q, n)
	early := 0
	for _, a := range got {
		if a.at.Before(due[a.msg.UUID]) {
			early++
		}
	}
	assert.Zero(t, early, "messages delivered early")
}

// A delayed message to a topic exchange is routed by its routing key on arrival, exactly as
// an immediate one. (Their delays take different paths through the levels: on a loaded
// machine one 100 ms longer can arrive first.)
func TestDelayedTopicRouting(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	events := env.Exchange("events")
	orders, all, invoices := env.Queue("orders"), env.Queue("all"), env.Queue("invoices")
	p := newPublisher(t, env, func(c *dlx.Config) {
		c.Route = dlx.ToExchange(events)
		c.Declare = topology.Topology{
			Exchanges: []topology.Exchange{{Name: events, Kind: topology.Topic}},
			Queues:    []topology.Queue{{Name: orders}, {Name: all}, {Name: invoices}},
			Bindings: []topology.Binding{
				{Exchange: events, Queue: orders, Key: "order.*"},
				{Exchange: events, Queue: all, Key: "#"},
				{Exchange: events, Queue: invoices, Key: "invoice.*"},
			},
		}
	})

	for i, key := range []string{"order.created", "order.eu.created", "invoice.paid"} {
		msg := message.NewMessage(key, nil)
		warren.Delay(msg, time.Duration(200+100*i)*time.Millisecond)
		require.NoError(t, p.Publish(key, msg))
	}

	uuids := func(as []arrival) []string {
		var s []string
		for _, a := range as {
			s = append(s, a.msg.UUID)
			assert.Equal(t, a.msg.UUID, a.d.RoutingKey, "routing key kept")
		}
		return s
	}
	assert.Equal(t, []string{"order.created"}, uuids(consume(t, env, orders, 1)))
	assert.Equal(t, []string{"invoice.paid"}, uuids(consume(t, env, invoices, 1)))
	assert.ElementsMatch(t, []string{"order.created", "order.eu.created", "invoice.paid"}, uuids(consume(t, env, all, 3)))
	// order.eu.created was routed (to all) and must not reach orders.
	assert.Never(t, func() bool {
		q, err := env.Inspect(orders)
		return err != nil || q.Messages > 0
	}, 200*time.Millisecond, 20*time.Millisecond, "order.eu.created must not match order.*")
}

// A destination deleted while messages wait: they end in the parking queue, with their
// destination, and the level goes on delivering to others.
//
// Not parallel: the queue must be deleted within the 700 ms delay.
func TestParkingWhenDestinationDeleted(t *testing.T) {
	env := testenv.Logic(t)
	gone, alive := env.Queue("gone"), env.Queue("alive")
	p := newPublisher(t, env, nil)

	msg := message.NewMessage(watermill.NewUUID(), []byte("orphan"))
	warren.Delay(msg, 700*time.Millisecond)
	require.NoError(t, p.Publish(gone, msg))
	_, err := env.Channel().QueueDelete(gone, false, false, false)
	require.NoError(t, err)

	after := message.NewMessage(watermill.NewUUID(), []byte("after"))
	warren.Delay(after, 700*time.Millisecond)
	require.NoError(t, p.Publish(alive, after))

	got := consume(t, env, alive, 1)
	assert.Equal(t, after.UUID, got[0].msg.UUID)

	parked := consume(t, env, p.Delay().ParkingQueue(), 1)
	assert.Equal(t, msg.UUID, parked[0].msg.UUID)
	assert.Equal(t, gone, parked[0].d.Headers[contract.DestQueueHeader])
	assert.Equal(t, "orphan", string(parked[0].msg.Payload))
}

// Not parallel: the exchange must be deleted within the 300 ms delay.
func TestParkedCount(t *testing.T) {
	env := testenv.Logic(t)
	x := env.Exchange("vanishing")
	p := newPublisher(t, env, func(c *dlx.Config) { c.Route = dlx.ExchangePerTopic })

	for range 3 {
		msg := message.NewMessage(watermill.NewUUID(), nil)
		warren.Delay(msg, 300*time.Millisecond)
		require.NoError(t, p.Publish(x, msg))
	}
	require.NoError(t, env.Channel().ExchangeDelete(x, false, false))
	require.Eventually(t, func() bool {
		n, err := p.Parked(context.Background())
		return err == nil && n == 3
	}, testenv.Patience(), 50*time.Millisecond)
}

// The destination is declared before the first publish to it: nothing published before the
// first consumer is lost, delayed or not.
func TestAutoCreateOnWrite(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("later")
	p := newPublisher(t, env, nil)

	now := message.NewMessage("now", nil)
	later := message.NewMessage("later", nil)
	warren.Delay(later, 200*time.Millisecond)
	require.NoError(t, p.Publish(q, now, later))

	got := consume(t, env, q, 2)
	assert.Equal(t, "now", got[0].msg.UUID)
	assert.Equal(t, "later", got[1].msg.UUID)

	// The work queue warren declared has its poison queue.
	assert.Zero(t, env.Messages(topology.PoisonQueue(q)))
}

func TestUnroutableIsAnError(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	x := env.Exchange("nobody-listens")
	p := newPublisher(t, env, func(c *dlx.Config) { c.Route = dlx.ExchangePerTopic })

	err := p.Publish(x, message.NewMessage(watermill.NewUUID(), nil))
	var ret *dlx.ReturnedError
	require.ErrorAs(t, err, &ret)
	assert.Equal(t, "NO_ROUTE", ret.ReplyText)

	lenient := newPublisher(t, env, func(c *dlx.Config) { c.Route = dlx.ExchangePerTopic; c.AllowUnroutable = true })
	assert.NoError(t, lenient.Publish(x, message.NewMessage(watermill.NewUUID(), nil)))
}

// In a batch, only the returned message fails Publish; the others are confirmed.
func TestReturnInBatchNamesTheMessage(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	x := env.Exchange("direct")
	q := env.Queue("bound")
	p := newPublisher(t, env, func(c *dlx.Config) {
		c.Route = dlx.ToExchange(x)
		c.Declare = topology.Topology{
			Exchanges: []topology.Exchange{{Name: x, Kind: topology.Direct}},
			Queues:    []topology.Queue{{Name: q}},
			Bindings:  []topology.Binding{{Exchange: x, Queue: q, Key: "yes"}},
		}
	})
	require.NoError(t, p.Publish("yes", message.NewMessage("a", nil), message.NewMessage("b", nil)))
	err := p.Publish("no", message.NewMessage("c", nil))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "message c")
	assert.Equal(t, 2, len(consume(t, env, q, 2)))
}

// A queue that rejects publishes when full makes the broker nack: Publish publishes again
// until its time limit, then fails; once there is room, it succeeds.
//
// Not parallel: room must be made within the 1 s time limit of the waiting Publish.
func TestNackIsRetriedUntilTheTimeLimit(t *testing.T) {
	env := testenv.Logic(t)
	q := env.Queue("full")
	p := newPublisher(t, env, func(c *dlx.Config) {
		c.PublishTimeout = time.Second
		// Classic: a quorum queue on RabbitMQ 4.0 takes a message more than x-max-length
		// before it rejects publishes.
		c.Declare = topology.Topology{Queues: []topology.Queue{{Name: q, Type: topology.Classic, Args: amqp.Table{
			"x-max-length": int64(1), "x-overflow": "reject-publish",
		}}}}
	})
	require.NoError(t, p.Publish(q, message.NewMessage("first", nil)))
	err := p.Publish(q, message.NewMessage("second", nil))
	require.ErrorIs(t, err, dlx.ErrNacked)
	assert.Contains(t, err.Error(), "second")
	assert.Contains(t, err.Error(), "gave up after 1s")
	assert.False(t, warren.IsPermanent(err))

	// Published while the queue is full, it waits (nacked and published again) and is
	// confirmed once there is room.
	published := make(chan error, 1)
	go func() { published <- p.Publish(q, message.NewMessage("third", nil)) }()
	require.Never(t, func() bool { return len(published) > 0 }, 200*time.Millisecond, 10*time.Millisecond)
	d, ok, err := env.Channel().Get(q, true)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, "first", d.MessageId)
	require.NoError(t, <-published)
	assert.Equal(t, "third", consume(t, env, q, 1)[0].msg.UUID)
}

func TestUnreachableBrokerGivesUpWithAClearError(t *testing.T) {
	t.Parallel()
	testenv.Slow(t)
	// A port nothing listens on, and a listener that accepts but never speaks AMQP.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := closed.Addr().String()
	closed.Close()

	for _, addr := range []string{refused, l.Addr().String()} {
		_, err := dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: "amqp://guest:guest@" + addr + "/", ConnectTimeout: 1500 * time.Millisecond}}, nil)
		require.Error(t, err, addr)
		assert.Contains(t, err.Error(), "gave up after 1.5s")
	}
}

// A broker that stops answering after the connection is up: Publish returns an error at its
// time limit rather than hanging.
func TestPublishTimeLimitWhenBrokerStopsAnswering(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.Queue("frozen")
	proxy, url := testenv.ProxyURL(t, env.URL)
	p := newPublisher(t, env, func(c *dlx.Config) {
		c.Connection.URL = url
		c.PublishTimeout = 1500 * time.Millisecond
	})
	require.NoError(t, p.Publish(q, message.NewMessage("before", nil)))

	proxy.Freeze()
	err := p.Publish(q, message.NewMessage("frozen", nil))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "gave up after 1.5s")
}

func TestWatermillDelayMetadata(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("watermill")
	p := newPublisher(t, env, nil)

	start := time.Now()
	forMsg := message.NewMessage("for", nil)
	// (Watermill's For is a due time from now too: a publish that a loaded machine holds up
	// past it goes straight to the queue, so the delays leave seconds for it.)
	delay.Message(forMsg, delay.For(2*time.Second))
	untilMsg := message.NewMessage("until", nil)
	delay.Message(untilMsg, delay.Until(start.Add(time.Second)))
	require.NoError(t, p.Publish(q, forMsg, untilMsg))

	got := consume(t, env, q, 2)
	// A delay is a lower bound, not an order: under load "until" can come after "for",
	// neither early.
	if got[0].msg.UUID == "for" {
		got[0], got[1] = got[1], got[0]
	}
	assert.Equal(t, "until", got[0].msg.UUID)
	assert.Equal(t, "for", got[1].msg.UUID)
	assert.GreaterOrEqual(t, got[0].at.Sub(start), time.Second)
	assert.GreaterOrEqual(t, got[1].at.Sub(start), 2*time.Second)
	// Watermill's metadata is sent on as headers; warren's Marshaler drops it on unmarshal
	// (a delivered message is not to be delayed again: see warren.IsDelayMetadata).
	assert.Equal(t, "2s", got[1].d.Headers[delay.DelayedForKey])
	assert.Empty(t, got[1].msg.Metadata.Get(delay.DelayedForKey))

	// A delivered message published again is not delayed again.
	again := got[1].msg.Copy()
	again.UUID = "again"
	require.NoError(t, p.Publish(q, again))
	forwarded := consume(t, env, q, 1)
	assert.Equal(t, "again", forwarded[0].msg.UUID)
	assert.True(t, strings.HasPrefix(got[1].d.Exchange, p.Delay().Name()+"."), "the delayed one came through the delay levels: %s", got[1].d.Exchange)
	assert.Empty(t, forwarded[0].d.Exchange, "published straight to the queue, not through the delay levels")
}

func TestInvalidDelaysAreErrorsNamingTheValue(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("invalid")
	p := newPublisher(t, env, nil)

	tooLong := message.NewMessage("long", nil)
	warren.Delay(tooLong, p.Delay().Max()+time.Millisecond)
	err := p.Publish(q, tooLong)
	require.ErrorIs(t, err, topology.ErrDelayTooLong)
	assert.Contains(t, err.Error(), (p.Delay().Max() + time.Millisecond).String())

	negative := message.NewMessage("neg", nil)
	warren.Delay(negative, -5*time.Second)
	assert.ErrorContains(t, p.Publish(q, negative), "delay -5s is negative")

	past := message.NewMessage("past", nil)
	at := time.Now().Add(-time.Hour)
	warren.DeliverAt(past, at)
	assert.ErrorContains(t, p.Publish(q, past), at.UTC().Format(time.RFC3339Nano))

	wmPast := message.NewMessage("wm-past", nil)
	delay.Message(wmPast, delay.Until(time.Now().Add(-time.Hour)))
	assert.ErrorContains(t, p.Publish(q, wmPast), "in the past")

	// The failed calls published nothing: they did not even declare the queue.
	_, err = env.Channel().QueueDeclarePassive(q, true, false, false, false, nil)
	assert.ErrorContains(t, err, "NOT_FOUND")
}

func TestPublishAfterCloseIsErrClosed(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	p := newPublisher(t, env, nil)
	require.NoError(t, p.Close())
	err := p.Publish(env.Queue("after-close"), message.NewMessage("m", nil))
	assert.ErrorIs(t, err, warren.ErrClosed)
}

func TestConfigErrorsNameTheField(t *testing.T) {
	_, err := dlx.NewPublisher(dlx.Config{}, nil)
	assert.ErrorContains(t, err, "Config.Connection.URL")
	_, err = dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: "amqp://x/"}, Topology: topology.Config{Delay: topology.Delay{Radix: 1}}}, nil)
	assert.ErrorContains(t, err, "Delay.Radix")
	_, err = dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: "amqp://x/"}, PublishTimeout: -time.Second}, nil)
	assert.ErrorContains(t, err, "Config.PublishTimeout")
	_, err = dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: "amqp://x/"}, Declare: topology.Topology{Queues: []topology.Queue{{}}}}, nil)
	assert.ErrorContains(t, err, "Queues[0].Name")
}

// A message that is delayed again carries no more than the first time: the level headers are
// rewritten and the broker's x-death is not published again.
func TestRedelayDoesNotGrow(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.Queue("redelay")
	p := newPublisher(t, env, nil)
	// Declare the destination first: declaring it (two quorum queues) on the first publish
	// would take time off that message's remaining delay, and change its digits.
	require.NoError(t, p.Publish(q))

	msg := message.NewMessage(watermill.NewUUID(), []byte("x"))
	msg.Metadata.Set("k", "v")
	warren.Delay(msg, 1234*time.Millisecond)
	require.NoError(t, p.Publish(q, msg))
	first := consume(t, env, q, 1)[0]
	assert.Contains(t, first.d.Headers, "x-death", "dead-lettered through the levels")

	again := first.msg.Copy()
	warren.Delay(again, 1234*time.Millisecond)
	require.NoError(t, p.Publish(q, again))
	second := consume(t, env, q, 1)[0]

	// The same headers come back. Only the level digits may differ: the remaining delay is
	// measured when the message is sent.
	assert.Equal(t, withoutTimes(first.d.Headers), withoutTimes(second.d.Headers))
	deaths, _ := second.d.Headers["x-death"].([]any)
	for _, d := range deaths {
		assert.EqualValues(t, 1, d.(amqp.Table)["count"], "x-death was published again")
	}
	assert.Equal(t, "v", second.msg.Metadata.Get("k"))
}

// withoutTimes returns h without the broker's dead-letter bookkeeping (x-death's entries
// carry times; x-first-death-queue and, from RabbitMQ 3.13, x-last-death-queue name a level
// queue, whose digit depends on the time left when the message was sent) and with each level
// digit replaced by whether it is a valid digit.
func withoutTimes(h amqp.Table) amqp.Table {
	out := amqp.Table{}
	for k, v := range h {
		switch {
		case k == "x-death" || strings.HasPrefix(k, "x-first-death-") || strings.HasPrefix(k, "x-last-death-"):
		case k == contract.PublishIDHeader: // one per publish: replaced, never accumulated
			out[k] = v != ""
		case k == contract.DueHeader: // when it is due: one per publish, replaced
			_, isTime := v.(int64)
			out[k] = isTime
		case strings.HasPrefix(k, "warren-dlx-p"):
			d, err := strconv.Atoi(fmt.Sprint(v))
			out[k] = err == nil && d >= 0 && d < 16
		default:
			out[k] = v
		}
	}
	return out
}

// A URL list with a node that is down (first or not: the order is random) publishes through
// the node that answers.
func TestPublisherTakesAListOfNodes(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("nodes")
	down := testenv.WithHost(t, env.URL, testenv.ClosedPort(t))
	p := newPublisher(t, env, func(c *dlx.Config) { c.Connection.URL = down + "," + env.URL })
	for i := range 5 {
		require.NoError(t, p.Publish(q, message.NewMessage(fmt.Sprint(i), []byte("x"))))
	}
	assert.Len(t, consume(t, env, q, 5), 5)
}

// Delays beyond the levels' maximum wait in the chain first, then in the levels: with a
// layout whose levels hold 150 ms and whose chain of 19 queues reaches 3 s, the long-range
// path runs end to end in seconds. None arrives early.
func TestLongDelaysThroughTheChain(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.Queue("chain")
	layout := env.Delay(topology.Delay{Radix: 4, Levels: 2, Unit: 10 * time.Millisecond, Reach: 3 * time.Second})
	require.Equal(t, 19, layout.Chain())
	p := newPublisher(t, env, func(c *dlx.Config) { c.Topology.Delay = layout })

	delays := []time.Duration{layout.Max(), 450 * time.Millisecond, 2 * time.Second, 100 * time.Millisecond,
		1200 * time.Millisecond, 750 * time.Millisecond, 2600 * time.Millisecond}
	due := map[string]time.Time{}
	for _, d := range delays {
		msg := message.NewMessage(d.String(), nil)
		warren.Delay(msg, d)
		due[msg.UUID] = time.Now().Add(d)
		require.NoError(t, p.Publish(q, msg))
	}
	got := consume(t, env, q, len(delays))
	for _, a := range got {
		assert.False(t, a.at.Before(due[a.msg.UUID]), "%s arrived %s early", a.msg.UUID, due[a.msg.UUID].Sub(a.at))
		t.Logf("%s: %s late", a.msg.UUID, a.at.Sub(due[a.msg.UUID]).Round(time.Millisecond))
	}
}

// A delay past RabbitMQ's largest TTL (49.7 days) is accepted and waits in the chain queue
// its plan names: here radix 2 levels, 2³²-1 ms, and a chain of one.
func TestDelayPastTheLargestTTLWaitsInTheChain(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("sixty-days")
	layout := env.Delay(topology.Delay{Radix: 2, Reach: 60 * 24 * time.Hour})
	require.Equal(t, 1, layout.Chain())
	p := newPublisher(t, env, func(c *dlx.Config) { c.Topology.Delay = layout })

	msg := message.NewMessage("in-sixty-days", nil)
	warren.Delay(msg, 60*24*time.Hour)
	require.NoError(t, p.Publish(q, msg))
	ch := env.Channel()
	require.Eventually(t, func() bool {
		w, err := ch.QueueDeclarePassive(layout.ChainQueue(1), true, false, false, false, nil)
		return err == nil && w.Messages == 1
	}, testenv.Patience(), 10*time.Millisecond, "the message waits in %s", layout.ChainQueue(1))
	d, ok, err := ch.Get(layout.ChainQueue(1), true)
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, "in-sixty-days", d.MessageId)
	assert.Equal(t, q, d.Headers[contract.DestQueueHeader])
}
