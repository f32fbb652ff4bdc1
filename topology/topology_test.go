package topology_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

func TestPlanRoundsUpAndWritesDigits(t *testing.T) {
	d := topology.Delay{Radix: 16, Unit: time.Millisecond, Levels: 4}
	plan, err := d.Plan(0x1203*time.Millisecond + time.Microsecond) // rounds up to 0x1204
	require.NoError(t, err)
	assert.Equal(t, 0x1204*time.Millisecond, plan.Delay)
	assert.Equal(t, d.LevelExchange(3), plan.Exchange)
	assert.Equal(t, amqp.Table{
		contract.DigitHeader(0): "4", contract.DigitHeader(1): "0", contract.DigitHeader(2): "2", contract.DigitHeader(3): "1",
	}, plan.Headers)
	assert.Equal(t, 3, plan.Hops)

	// The TTLs of the queues on the way add up to the planned delay.
	total := d.TTL(0, 4) + d.TTL(2, 2) + d.TTL(3, 1)
	assert.Equal(t, plan.Delay, total)

	zero, err := d.Plan(0)
	require.NoError(t, err)
	assert.Empty(t, zero.Exchange, "no delay: published at once")

	sub, err := d.Plan(time.Nanosecond)
	require.NoError(t, err)
	assert.Equal(t, time.Millisecond, sub.Delay, "never rounded down to zero")

	assert.Equal(t, (1<<16-1)*time.Millisecond, d.Max())
	_, err = d.Plan(d.Max())
	assert.NoError(t, err)
	_, err = d.Plan(d.Max() + time.Nanosecond)
	assert.ErrorIs(t, err, topology.ErrDelayTooLong)
	_, err = d.Plan(-time.Second)
	assert.ErrorContains(t, err, "-1s is negative")
}

// Above the levels' maximum, a delay enters the chain with the fewest hops that leave a rest
// the levels can hold, and carries that rest's digits down from the top position.
func TestPlanThroughTheChain(t *testing.T) {
	d := topology.Delay{Radix: 4, Levels: 2, Unit: 10 * time.Millisecond, Reach: 2 * time.Second}
	assert.Equal(t, 150*time.Millisecond, d.ChainTTL(), "the levels' maximum, 15 units")
	assert.Equal(t, 13, d.Chain(), "ceil((2000-150)/150)")
	assert.Equal(t, 2100*time.Millisecond, d.Max())

	plan, err := d.Plan(151 * time.Millisecond) // 16 units: one hop of 15, then 1
	require.NoError(t, err)
	assert.Equal(t, 160*time.Millisecond, plan.Delay)
	assert.Equal(t, d.ChainExchange(1), plan.Exchange)
	assert.Equal(t, amqp.Table{contract.DigitHeader(0): "1", contract.DigitHeader(1): "0"}, plan.Headers, "the top digit, 0, too")
	assert.Equal(t, 2, plan.Hops)

	plan, err = d.Plan(150 * time.Millisecond) // the levels' maximum: no chain
	require.NoError(t, err)
	assert.Equal(t, d.LevelExchange(1), plan.Exchange)

	plan, err = d.Plan(d.Max())
	require.NoError(t, err)
	assert.Equal(t, d.ChainExchange(13), plan.Exchange)
	assert.Equal(t, amqp.Table{contract.DigitHeader(0): "3", contract.DigitHeader(1): "3"}, plan.Headers)
	_, err = d.Plan(d.Max() + time.Nanosecond)
	assert.ErrorIs(t, err, topology.ErrDelayTooLong)
}

// For the default layout, across its whole range: the chain hops and the digits add up to
// the delay rounded up to the unit, the rest fits in the levels, and the entry is right.
func TestPlanArithmeticUpToTheLimit(t *testing.T) {
	d := topology.Delay{}.WithDefaults()
	levelsMax := time.Duration(1<<32-1) * time.Millisecond
	delays := []time.Duration{time.Nanosecond, time.Millisecond, levelsMax - time.Millisecond, levelsMax,
		levelsMax + time.Nanosecond, levelsMax + time.Millisecond, 2 * levelsMax, 2*levelsMax + 1, 365 * 24 * time.Hour,
		topology.DefaultDelayReach, d.Max() - time.Millisecond, d.Max()}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		delays = append(delays, time.Duration(r.Int64N(int64(d.Max()))))
	}
	for _, delay := range delays {
		plan, err := d.Plan(delay)
		require.NoError(t, err, delay)
		want := (delay + time.Millisecond - 1).Truncate(time.Millisecond)
		require.Equal(t, want, plan.Delay, delay)

		var total time.Duration
		hops := 0
		for p := range d.Levels {
			s, ok := plan.Headers[contract.DigitHeader(p)].(string)
			if !ok {
				continue
			}
			digit, err := strconv.Atoi(s)
			require.NoError(t, err)
			require.Less(t, digit, d.Radix)
			if digit > 0 {
				total += d.TTL(p, digit)
				hops++
			}
		}
		chain := 0
		if n, ok := strings.CutPrefix(plan.Exchange, d.Name()+".c"); ok {
			chain, err = strconv.Atoi(n)
			require.NoError(t, err, plan.Exchange)
			require.Greater(t, plan.Delay, levelsMax, "only what the levels cannot hold enters the chain")
			require.Len(t, plan.Headers, d.Levels, "every digit, down from the top position")
			require.Equal(t, d.ChainExchange(chain), plan.Exchange)
			require.Greater(t, total, levelsMax-d.ChainTTL(), "the fewest hops: one less would leave too much")
		} else {
			require.Equal(t, d.LevelExchange(len(plan.Headers)-1), plan.Exchange)
		}
		require.LessOrEqual(t, chain, d.Chain())
		require.Equal(t, plan.Delay, total+time.Duration(chain)*d.ChainTTL(), delay)
		require.Equal(t, hops+chain, plan.Hops)
	}
}

func TestDefaultDelayLayout(t *testing.T) {
	d := topology.Delay{}.WithDefaults()
	assert.Equal(t, 120+73, d.QueueCount(), "8 levels of 15 queues and a chain of 73")
	assert.Equal(t, 73, d.Chain())
	assert.Equal(t, time.Duration(1<<32-1)*time.Millisecond, d.ChainTTL(), "RabbitMQ's largest TTL")
	assert.Equal(t, 74*time.Duration(1<<32-1)*time.Millisecond, d.Max())
	assert.GreaterOrEqual(t, d.Max(), topology.DefaultDelayReach)
	assert.Equal(t, 87660*time.Hour, topology.DefaultDelayReach, "10 years of 365.25 days")
	assert.Equal(t, 0, topology.Delay{Levels: 8}.Chain(), "Levels set, Reach not: the levels alone")
	assert.Equal(t, 1, topology.Delay{Levels: 8, Reach: 60 * 24 * time.Hour}.Chain())
	assert.Equal(t, topology.Quorum, d.QueueType, "a Delay on its own is quorum")
	assert.Equal(t, "warren.delay.quorum.1ms.r16", d.Name())
	assert.Equal(t, "warren.delay.classic.1ms.r16", topology.Delay{QueueType: topology.Classic}.Name())
	assert.NoError(t, d.Validate())

	// By default, as many levels as the largest TTL RabbitMQ accepts allows.
	for radix, levels := range map[int]int{2: 32, 4: 16, 8: 10, 32: 6, 64: 5} {
		d := topology.Delay{Radix: radix}.WithDefaults()
		assert.Equal(t, levels, d.Levels, "radix %d", radix)
		assert.NoError(t, d.Validate(), "radix %d", radix)
		assert.Error(t, topology.Delay{Radix: radix, Levels: levels + 1}.Validate(), "radix %d", radix)
	}
}

func TestConfigValidationNamesTheField(t *testing.T) {
	for field, cfg := range map[string]topology.Config{
		"Delay.Unit":      {Delay: topology.Delay{Unit: 1500 * time.Microsecond}},
		"Delay.Radix":     {Delay: topology.Delay{Radix: 300}},
		"Delay.Levels":    {Delay: topology.Delay{Levels: 9}}, // 15·16^8 ms is above the TTL limit
		"QueueType":       {QueueType: "stream"},
		"ExchangeKind":    {ExchangeKind: "x-delayed-message"},
		"DeliveryLimit":   {DeliveryLimit: -1},
		"Delay.QueueType": {Delay: topology.Delay{QueueType: "lazy"}},
		"Delay.Reach -1s": {Delay: topology.Delay{Reach: -time.Second}},
		"Delay.Reach 1h0m0s needs 1085 chain queues of 3.315s": {Delay: topology.Delay{Radix: 4, Levels: 4, Unit: 13 * time.Millisecond,
			Reach: time.Hour}},
	} {
		_, err := topology.NewBuilder(cfg, nil)
		assert.ErrorContains(t, err, field)
	}
	for field, top := range map[string]topology.Topology{
		"Bindings[0].Headers": {Bindings: []topology.Binding{{Exchange: "e", Queue: "q", Headers: map[string]string{"x-kind": "a"}}}},
		"Bindings[0] needs":   {Bindings: []topology.Binding{{Exchange: "e"}}},
		"Exchanges[0].Kind":   {Exchanges: []topology.Exchange{{Name: "e", Kind: "delayed"}}},
		"Queues[0].Name":      {Queues: []topology.Queue{{Name: "amq.q"}}},
	} {
		assert.ErrorContains(t, top.Validate(), field)
	}
}

func newBuilder(t *testing.T, env *testenv.Env, cfg topology.Config) *topology.Builder {
	t.Helper()
	cfg.Delay = env.Delay(cfg.Delay)
	b, err := topology.NewBuilder(cfg, env.Logger())
	require.NoError(t, err)
	return b
}

func publish(t *testing.T, ch *amqp.Channel, exchange, key string, headers amqp.Table, body string) {
	t.Helper()
	require.NoError(t, ch.Publish(exchange, key, false, false, amqp.Publishing{Headers: headers, Body: []byte(body)}))
}

// drain waits (up to 5 s) until queue holds the n messages expected in it, and returns the
// bodies of all it holds then.
func drain(t *testing.T, ch *amqp.Channel, queue string, n int) []string {
	t.Helper()
	require.Eventually(t, func() bool {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err == nil && q.Messages >= n
	}, testenv.Patience(), 5*time.Millisecond, "queue %s: fewer than %d messages arrived", queue, n)
	var bodies []string
	for {
		d, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			return bodies
		}
		bodies = append(bodies, string(d.Body))
	}
}

func TestDeclareAllExchangeKindsAndBindings(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	direct, fanout, topic, headers := env.Exchange("direct"), env.Exchange("fanout"), env.Exchange("topic"), env.Exchange("headers")
	qd, qf1, qf2, qt, qh := env.Queue("d"), env.Queue("f1"), env.Queue("f2"), env.Queue("t"), env.Queue("h")
	top := topology.Topology{
		Exchanges: []topology.Exchange{
			{Name: direct, Kind: topology.Direct}, {Name: fanout, Kind: topology.Fanout},
			{Name: topic, Kind: topology.Topic}, {Name: headers, Kind: topology.Headers},
		},
		Queues: []topology.Queue{{Name: qd}, {Name: qf1}, {Name: qf2}, {Name: qt}, {Name: qh}},
		Bindings: []topology.Binding{
			{Exchange: direct, Queue: qd, Key: "pay"},
			{Exchange: fanout, Queue: qf1}, {Exchange: fanout, Queue: qf2},
			{Exchange: topic, Queue: qt, Key: "order.*.eu"},
			{Exchange: headers, Queue: qh, Headers: map[string]string{"kind": "refund", "region": "eu"}},
			{Exchange: topic, ToExchange: fanout, Key: "broadcast.#"},
		},
	}
	b := newBuilder(t, env, topology.Config{})
	ch := env.Channel()
	require.NoError(t, b.Declare(context.Background(), ch, top))
	require.NoError(t, b.Declare(context.Background(), ch, top), "declaring is idempotent")

	publish(t, ch, direct, "pay", nil, "d1")
	publish(t, ch, direct, "other", nil, "d2")
	publish(t, ch, fanout, "", nil, "f")
	publish(t, ch, topic, "order.created.eu", nil, "t1")
	publish(t, ch, topic, "order.created.us", nil, "t2")
	publish(t, ch, topic, "broadcast.all", nil, "b")
	publish(t, ch, headers, "", amqp.Table{"kind": "refund", "region": "eu"}, "h1")
	publish(t, ch, headers, "", amqp.Table{"kind": "refund", "region": "us"}, "h2")

	assert.Equal(t, []string{"d1"}, drain(t, ch, qd, 1))
	assert.Equal(t, []string{"f", "b"}, drain(t, ch, qf1, 2))
	assert.Equal(t, []string{"f", "b"}, drain(t, ch, qf2, 2))
	assert.Equal(t, []string{"t1"}, drain(t, ch, qt, 1))
	assert.Equal(t, []string{"h1"}, drain(t, ch, qh, 1))
}

// declareClash declares a queue of its own with an argument warren does not declare it with,
// and returns its name.
func declareClash(t *testing.T, env *testenv.Env) string {
	t.Helper()
	q := env.Queue("clash")
	_, err := env.Channel().QueueDeclare(q, true, false, false, false, amqp.Table{"x-message-ttl": int64(1000)})
	require.NoError(t, err)
	return q
}

func TestExistingQueueWithOtherArgumentsNamesQueueAndArgument(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := declareClash(t, env)

	b := newBuilder(t, env, topology.Config{})
	err := b.Declare(context.Background(), env.Channel(), topology.Topology{Queues: []topology.Queue{{Name: q}}})
	var m *topology.MismatchError
	require.ErrorAs(t, err, &m)
	assert.Equal(t, q, m.Name)
	assert.Equal(t, "queue", m.What)
	assert.Regexp(t, `argument x-`, m.Argument)
	assert.Contains(t, err.Error(), q)
	var ae *amqp.Error
	assert.True(t, errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed, "the broker's reply is kept")
}

// The builder sends its declarations without waiting for each answer: a refusal among them
// is still reported for the object it is about, and the broker declares nothing after it.
func TestARefusalAmongManyDeclarationsNamesItsObject(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	clash := declareClash(t, env)
	var queues []topology.Queue
	for i := range 40 {
		queues = append(queues, topology.Queue{Name: env.Queue(fmt.Sprintf("q%d", i))})
	}
	queues = slices.Insert(queues, 25, topology.Queue{Name: clash})

	b := newBuilder(t, env, topology.Config{})
	err := b.Declare(context.Background(), env.Channel(), topology.Topology{Queues: queues})
	var m *topology.MismatchError
	require.ErrorAs(t, err, &m)
	assert.Equal(t, clash, m.Name)
	assert.Equal(t, "queue", m.What)
	_, err = env.Inspect(queues[24].Name)
	assert.NoError(t, err, "the queue before the refused one is declared")
	_, err = env.Inspect(topology.PoisonQueue(queues[26].Name))
	assert.ErrorContains(t, err, "NOT_FOUND", "nothing after the refusal is declared")

	missing := env.Exchange("missing")
	bd := topology.Binding{Exchange: missing, Queue: queues[0].Name, Key: "k"}
	err = b.Declare(context.Background(), env.Channel(), topology.Topology{Queues: queues[:10], Bindings: []topology.Binding{bd}})
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("topology: declare binding %q: ", bd.String()))
	assert.Contains(t, err.Error(), "NOT_FOUND - no exchange '"+missing+"'")
}

func TestVerifyDeclaresNothingAndReportsDifferences(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q, x := env.Queue("verified"), env.Exchange("verified")
	top := topology.Topology{
		Exchanges: []topology.Exchange{{Name: x, Kind: topology.Fanout}},
		Queues:    []topology.Queue{{Name: q}},
		Bindings:  []topology.Binding{{Exchange: x, Queue: q}},
	}
	b := newBuilder(t, env, topology.Config{Delay: topology.Delay{Levels: 2}})
	r, err := b.Verify(context.Background(), env.Connection(), top)
	require.NoError(t, err)
	assert.False(t, r.OK())
	assert.Contains(t, r.Missing, `queue "`+q+`"`)
	assert.Contains(t, r.Missing, `exchange "`+x+`"`)
	assert.Contains(t, r.Missing, `queue "`+b.Delay().LevelQueue(1, 15)+`"`)
	assert.Len(t, r.Unchecked, 1+2*16+2+1) // parking, 2 levels of 16 bindings, delivery to x and q, x->q
	_, err = env.Channel().QueueDeclarePassive(q, true, false, false, false, nil)
	require.ErrorContains(t, err, "NOT_FOUND", "verify declared the queue")

	require.NoError(t, b.Declare(context.Background(), env.Channel(), top))
	r, err = b.Verify(context.Background(), env.Connection(), top)
	require.NoError(t, err)
	assert.True(t, r.OK(), r.String())

	changed := top
	changed.Exchanges = []topology.Exchange{{Name: x, Kind: topology.Topic}}
	changed.Queues = []topology.Queue{{Name: q, Type: topology.Classic}}
	r, err = b.Verify(context.Background(), env.Connection(), changed)
	require.NoError(t, err)
	require.Len(t, r.Differs, 3, r.String()) // the exchange, the queue and its poison queue
	assert.Equal(t, x, r.Differs[0].Name)
	assert.Equal(t, "argument type", r.Differs[0].Argument)
	for i, name := range []string{q, topology.PoisonQueue(q)} {
		assert.Equal(t, name, r.Differs[1+i].Name)
		assert.Equal(t, "argument x-queue-type", r.Differs[1+i].Argument)
		assert.Equal(t, topology.Quorum, r.Differs[1+i].Existing)
	}
	assert.Contains(t, r.String(), `differs: queue "`+q+`": argument x-queue-type (it is a quorum queue): keep it quorum`)
}

// A quorum work queue has an explicit delivery limit and dead-letters at least once into its
// poison queue when the limit is passed.
func TestQuorumWorkQueueDeliveryLimitLeadsToPoison(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.Queue("quorum")
	b := newBuilder(t, env, topology.Config{QueueType: topology.Quorum, DeliveryLimit: 2})
	ch := env.Channel()
	require.NoError(t, b.DeclareQueue(context.Background(), ch, topology.Queue{Name: q}))
	publish(t, ch, "", q, nil, "hopeless")

	// Take and return the message until it is in the poison queue: once there, it never
	// comes back to q.
	deliveries := 0
	require.Eventually(t, func() bool {
		d, ok, err := ch.Get(q, false)
		if !assert.NoError(t, err) {
			return false
		}
		if ok {
			deliveries++
			assert.NoError(t, d.Nack(false, true))
			return false
		}
		d, ok, err = ch.Get(topology.PoisonQueue(q), true)
		return assert.NoError(t, err) && ok && string(d.Body) == "hopeless"
	}, testenv.Patience(), 10*time.Millisecond, "the message did not reach the poison queue")
	assert.Equal(t, 3, deliveries, "returned to the queue up to the limit (2), then dead-lettered")
	_, ok, err := ch.Get(q, false)
	require.NoError(t, err)
	assert.False(t, ok, "the message is still in the work queue")

	// Declared as quorum: declaring it classic now is refused, naming the argument.
	classic := newBuilder(t, env, topology.Config{QueueType: topology.Classic})
	err = classic.DeclareQueue(context.Background(), env.Channel(), topology.Queue{Name: q})
	var m *topology.MismatchError
	require.ErrorAs(t, err, &m)
	assert.Equal(t, "argument x-queue-type", m.Argument)
	assert.Equal(t, topology.Quorum, m.Existing)
}

func TestClassicWorkQueueRejectedMessageGoesToPoison(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("classic")
	b := newBuilder(t, env, topology.Config{QueueType: topology.Classic})
	ch := env.Channel()
	require.NoError(t, b.DeclareQueue(context.Background(), ch, topology.Queue{Name: q}))
	publish(t, ch, "", q, nil, "bad")
	d, ok, err := ch.Get(q, false)
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, d.Reject(false))
	assert.Equal(t, []string{"bad"}, drain(t, ch, topology.PoisonQueue(q), 1))
}

// The delay levels are declared with one fixed TTL per queue, and a quorum layout works too.
func TestDelayLevelsDeliver(t *testing.T) {
	t.Parallel()
	for _, typ := range []topology.QueueType{topology.Classic, topology.Quorum} {
		t.Run(string(typ), func(t *testing.T) {
			t.Parallel()
			env := testenv.Logic(t)
			q := env.Queue("dest")
			b := newBuilder(t, env, topology.Config{Delay: topology.Delay{Radix: 4, Levels: 6, QueueType: typ}})
			ch := env.Channel()
			require.NoError(t, b.Declare(context.Background(), ch, topology.Topology{Queues: []topology.Queue{{Name: q}}}))

			plan, err := b.Delay().Plan(333 * time.Millisecond) // 333 = 11031 in base 4: four hops
			require.NoError(t, err)
			require.Equal(t, 4, plan.Hops)
			plan.Headers[contract.DestQueueHeader] = q
			start := time.Now()
			publish(t, ch, plan.Exchange, q, plan.Headers, "late")
			var d amqp.Delivery
			require.Eventually(t, func() bool {
				var ok bool
				d, ok, err = ch.Get(q, true)
				return err == nil && ok
			}, testenv.Patience(), 5*time.Millisecond)
			assert.GreaterOrEqual(t, time.Since(start), 333*time.Millisecond)
			assert.Equal(t, q, d.RoutingKey)
		})
	}
}

// Classic level queues are version 2 (see Delay): the same queue with version 1 is refused.
func TestClassicDelayLevelsAreVersion2(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	b := newBuilder(t, env, topology.Config{QueueType: topology.Classic, Delay: topology.Delay{Levels: 1}})
	require.NoError(t, b.Declare(context.Background(), env.Channel(), topology.Topology{}))
	d := b.Delay()
	declare := func(version int32) error {
		_, err := env.Channel().QueueDeclare(d.LevelQueue(0, 1), true, false, false, false, amqp.Table{
			amqp.QueueMessageTTLArg: int64(1), "x-dead-letter-exchange": d.DeliveryExchange(),
			amqp.QueueTypeArg: amqp.QueueTypeClassic, amqp.QueueVersionArg: version,
		})
		return err
	}
	assert.NoError(t, declare(2))
	assert.ErrorContains(t, declare(1), "inequivalent arg 'x-queue-version'")
}

// A watermill-amqp Subscriber with the Builder as its TopologyBuilder creates what it reads
// from, including the poison queue and kill exchange, and reads warren's messages.
func TestWatermillSubscriberUsesBuilder(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.Queue("wm")
	b := newBuilder(t, env, topology.Config{})
	cfg := wamqp.NewDurableQueueConfig(env.URL)
	cfg.TopologyBuilder = b
	cfg.Marshaler = warren.Marshaler{}
	sub, err := wamqp.NewSubscriber(cfg, watermill.NopLogger{})
	require.NoError(t, err)
	defer sub.Close()
	msgs, err := sub.Subscribe(context.Background(), q)
	require.NoError(t, err)

	ch := env.Channel()
	_, err = ch.QueueDeclarePassive(topology.PoisonQueue(q), true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDeclarePassive(topology.KillExchange(q), "fanout", true, false, false, false, nil))

	pub, err := warren.Marshaler{}.Marshal(message.NewMessage("m-1", []byte("hi")))
	require.NoError(t, err)
	pub.Headers["x-delivery-count"] = int64(1)
	require.NoError(t, ch.Publish("", q, false, false, pub))
	select {
	case m := <-msgs:
		assert.Equal(t, "m-1", m.UUID)
		m.Ack()
	case <-time.After(testenv.Patience()):
		t.Fatal("no message")
	}
}
