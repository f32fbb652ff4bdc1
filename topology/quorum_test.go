package topology_test

import (
	"context"
	"math"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

func TestQueueTypeDefaultsAndOverrides(t *testing.T) {
	c := topology.Config{}.WithDefaults()
	assert.Equal(t, topology.Quorum, c.QueueType)
	assert.Equal(t, topology.Quorum, c.Delay.QueueType)

	c = topology.Config{QueueType: topology.Classic}.WithDefaults()
	assert.Equal(t, topology.Classic, c.Delay.QueueType, "the levels follow Config.QueueType")

	c = topology.Config{QueueType: topology.Classic, Delay: topology.Delay{QueueType: topology.Quorum}}.WithDefaults()
	assert.Equal(t, topology.Classic, c.QueueType)
	assert.Equal(t, topology.Quorum, c.Delay.QueueType, "an explicit Delay.QueueType wins")
	assert.Equal(t, c, c.WithDefaults(), "idempotent")

	b, err := topology.NewBuilder(topology.Config{QueueType: topology.Classic}, nil)
	require.NoError(t, err)
	assert.Equal(t, amqp.QueueTypeQuorum, b.QueueArgs(topology.Queue{Name: "q", Type: topology.Quorum})[amqp.QueueTypeArg],
		"Queue.Type wins")
	assert.NotContains(t, b.QueueArgs(topology.Queue{Name: "q"}), amqp.QueueTypeArg,
		"a classic work queue is declared as earlier versions did, without x-queue-type")
}

// redeclare declares queue again with args on a channel of its own: the broker accepts that
// only when the queue has exactly these arguments (among those it compares, which include
// x-queue-type and x-delivery-limit).
func redeclare(t *testing.T, env *testenv.Env, queue string, args amqp.Table) {
	t.Helper()
	_, err := env.Channel().QueueDeclare(queue, true, false, false, false, args)
	assert.NoError(t, err, "queue %s", queue)
}

// Everything warren declares is quorum by default: work queue, poison queue, level queues and
// parking queue, each with its arguments.
func TestDefaultsAreQuorumEverywhere(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("work")
	b := newBuilder(t, env, topology.Config{Delay: topology.Delay{Levels: 2}})
	require.NoError(t, b.Declare(context.Background(), env.Channel(), topology.Topology{Queues: []topology.Queue{{Name: q}}}))
	d := b.Delay()
	assert.Contains(t, d.Name(), ".quorum.")

	redeclare(t, env, q, amqp.Table{
		"x-queue-type": "quorum", "x-delivery-limit": int64(20),
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": topology.PoisonQueue(q),
		"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
	})
	unlimited := amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(math.MaxInt32)}
	redeclare(t, env, topology.PoisonQueue(q), unlimited)
	redeclare(t, env, d.ParkingQueue(), unlimited)
	for _, pd := range [][2]int{{0, 1}, {1, 15}} {
		redeclare(t, env, d.LevelQueue(pd[0], pd[1]), amqp.Table{
			"x-queue-type": "quorum", "x-message-ttl": d.TTL(pd[0], pd[1]).Milliseconds(),
			"x-dead-letter-exchange": map[int]string{0: d.DeliveryExchange(), 1: d.LevelExchange(0)}[pd[0]],
			"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish",
		})
	}
}

// Config.QueueType Classic switches all four kinds.
func TestClassicSwitch(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("work")
	b := newBuilder(t, env, topology.Config{QueueType: topology.Classic, Delay: topology.Delay{Levels: 1}})
	require.NoError(t, b.Declare(context.Background(), env.Channel(), topology.Topology{Queues: []topology.Queue{{Name: q}}}))
	d := b.Delay()
	assert.Equal(t, topology.Classic, d.QueueType)
	assert.Contains(t, d.Name(), ".classic.")

	redeclare(t, env, q, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": topology.PoisonQueue(q)})
	redeclare(t, env, topology.PoisonQueue(q), nil)
	redeclare(t, env, d.ParkingQueue(), amqp.Table{"x-queue-type": "classic", "x-queue-version": int32(2)})
	redeclare(t, env, d.LevelQueue(0, 7), amqp.Table{
		"x-queue-type": "classic", "x-queue-version": int32(2),
		"x-message-ttl": int64(7), "x-dead-letter-exchange": d.DeliveryExchange(),
	})
	for _, queue := range []string{q, topology.PoisonQueue(q), d.ParkingQueue(), d.LevelQueue(0, 7)} {
		_, err := env.Channel().QueueDeclare(queue, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		assert.Error(t, err, "queue %s is not quorum", queue)
	}
}

// A quorum poison or parking queue is browsed: a message returned to it any number of times
// stays (with the work queue's limit of 20 it was dropped after its 21st delivery).
func TestPoisonAndParkingQueuesKeepBrowsedMessages(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("work")
	b := newBuilder(t, env, topology.Config{QueueType: topology.Quorum, Delay: topology.Delay{QueueType: topology.Quorum, Levels: 1}})
	ch := env.Channel()
	require.NoError(t, b.Declare(context.Background(), ch, topology.Topology{Queues: []topology.Queue{{Name: q}}}))
	for _, queue := range []string{topology.PoisonQueue(q), b.Delay().ParkingQueue()} {
		publish(t, ch, "", queue, nil, "browsed")
		for i := range 30 {
			var d amqp.Delivery
			require.Eventually(t, func() bool {
				var ok bool
				var err error
				d, ok, err = ch.Get(queue, false)
				require.NoError(t, err)
				return ok
			}, testenv.Patience(), 5*time.Millisecond, "%s: the message is gone after %d deliveries", queue, i)
			require.NoError(t, d.Nack(false, true))
		}
	}
}

// A classic work queue as earlier versions of warren declared it (with its poison queue) is
// refused with a MismatchError that names the queue, x-queue-type and what to do.
func TestExistingClassicWorkQueueIsAMismatchOfQueueType(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.Queue("old")
	ch := env.Channel()
	_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": topology.PoisonQueue(q)})
	require.NoError(t, err)
	_, err = ch.QueueDeclare(topology.PoisonQueue(q), true, false, false, false, nil)
	require.NoError(t, err)

	b := newBuilder(t, env, topology.Config{})
	err = b.DeclareQueue(context.Background(), env.Channel(), topology.Queue{Name: q})
	var m *topology.MismatchError
	require.ErrorAs(t, err, &m)
	assert.Equal(t, "queue", m.What)
	assert.Equal(t, q, m.Name)
	assert.Equal(t, "argument x-queue-type", m.Argument)
	assert.Equal(t, topology.Classic, m.Existing)
	assert.Contains(t, err.Error(), `queue "`+q+`" exists with a different argument x-queue-type (it is a classic queue): `+
		`keep it classic (Queue.Type, or Config.QueueType: topology.Classic), or drain and delete it (`+"`warren kill "+q+" --delete`"+
		`) and let warren declare it again as quorum`)
	assert.Contains(t, err.Error(), "PRECONDITION_FAILED", "the broker's reply is kept")

	// The classic switch declares it as it is.
	classic := newBuilder(t, env, topology.Config{QueueType: topology.Classic})
	require.NoError(t, classic.DeclareQueue(context.Background(), env.Channel(), topology.Queue{Name: q}))

	// A classic poison queue alone is named too, as the poison queue of its work queue.
	q2 := env.Queue("oldpoison")
	_, err = env.Channel().QueueDeclare(topology.PoisonQueue(q2), true, false, false, false, nil)
	require.NoError(t, err)
	err = b.DeclareQueue(context.Background(), env.Channel(), topology.Queue{Name: q2})
	require.ErrorAs(t, err, &m)
	assert.Equal(t, topology.PoisonQueue(q2), m.Name)
	assert.Equal(t, topology.Classic, m.Existing)
	assert.Contains(t, m.Hint, `it is the poison queue of "`+q2+`": keep both classic`)
}

// The levels of earlier versions (classic, named without the type, level exchanges without an
// alternate exchange) do not stop the new default levels from being declared next to them,
// and what waits in them still reaches its queue.
func TestNewLevelsNextToOldClassicLevels(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("dest")
	d := env.Delay(topology.Delay{Unit: 100 * time.Millisecond, Levels: 1})

	// The old layout, as the previous version declared it (one level queue of it suffices).
	old := d.Prefix + ".100ms.r16"
	oq, ox := []string{old + ".parked", old + ".p0.d3"}, []string{old + ".parking", old + ".deliver", old + ".p0"}
	env.Remove(oq, ox)
	ch := env.Channel()
	v2 := amqp.Table{"x-queue-type": "classic", "x-queue-version": int32(2)}
	require.NoError(t, ch.ExchangeDeclare(old+".parking", "fanout", true, false, false, false, nil))
	_, err := ch.QueueDeclare(old+".parked", true, false, false, false, v2)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(old+".parked", "", old+".parking", false, nil))
	require.NoError(t, ch.ExchangeDeclare(old+".deliver", "headers", true, false, false, false, amqp.Table{"alternate-exchange": old + ".parking"}))
	require.NoError(t, ch.ExchangeDeclare(old+".p0", "headers", true, false, false, false, nil))
	_, err = ch.QueueDeclare(old+".p0.d3", true, false, false, false, amqp.Table{
		"x-queue-type": "classic", "x-queue-version": int32(2), "x-message-ttl": int64(300), "x-dead-letter-exchange": old + ".deliver"})
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(old+".p0.d3", "", old+".p0", false, amqp.Table{"x-match": "all", contract.DigitHeader(0): "3"}))

	// The new default (quorum) levels with the same prefix, unit and radix.
	b, err := topology.NewBuilder(topology.Config{Delay: d}, env.Logger())
	require.NoError(t, err)
	require.NoError(t, b.Declare(context.Background(), env.Channel(), topology.Topology{Queues: []topology.Queue{{Name: q}}}))
	assert.NotEqual(t, old, b.Delay().Name())

	// An old process had bound q to the old delivery exchange; a message waiting in the old
	// level arrives, and so does one through the new levels.
	require.NoError(t, ch.QueueBind(q, "", old+".deliver", false, amqp.Table{"x-match": "all", contract.DestQueueHeader: q}))
	publish(t, ch, old+".p0", q, amqp.Table{contract.DigitHeader(0): "3", contract.DestQueueHeader: q}, "old")
	plan, err := b.Delay().Plan(300 * time.Millisecond)
	require.NoError(t, err)
	plan.Headers[contract.DestQueueHeader] = q
	publish(t, ch, plan.Exchange, q, plan.Headers, "new")
	var got []string
	require.Eventually(t, func() bool {
		d, ok, err := ch.Get(q, true)
		require.NoError(t, err)
		if ok {
			got = append(got, string(d.Body))
		}
		return len(got) == 2
	}, testenv.Patience(), 10*time.Millisecond)
	assert.ElementsMatch(t, []string{"old", "new"}, got)
}

// A message that a level exchange cannot route (digit header missing or not a digit, at the
// entry position or below it) is parked with its headers, not dropped.
func TestLevelExchangesParkWhatTheyCannotRoute(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("dest")
	b := newBuilder(t, env, topology.Config{Delay: topology.Delay{Levels: 2}})
	ch := env.Channel()
	require.NoError(t, b.Declare(context.Background(), ch, topology.Topology{Queues: []topology.Queue{{Name: q}}}))
	d := b.Delay()
	p0, p1 := contract.DigitHeader(0), contract.DigitHeader(1)
	sent := map[string]amqp.Table{
		"bad digit":         {p1: "x", p0: "1", contract.DestQueueHeader: q},
		"missing digit":     {p0: "1", contract.DestQueueHeader: q},
		"bad digit below":   {p1: "0", p0: "x", contract.DestQueueHeader: q},
		"missing below":     {p1: "0", contract.DestQueueHeader: q},
		"digit out of base": {p1: "16", contract.DestQueueHeader: q},
		"foreign":           {"kind": "refund"},
	}
	for body, h := range sent {
		publish(t, ch, d.LevelExchange(1), "rk."+body, h, body)
	}
	parked := map[string]amqp.Delivery{}
	require.Eventually(t, func() bool {
		m, ok, err := ch.Get(d.ParkingQueue(), true)
		require.NoError(t, err)
		if ok {
			parked[string(m.Body)] = m
		}
		return len(parked) == len(sent)
	}, testenv.Patience(), 10*time.Millisecond, "parked: %d of %d", len(parked), len(sent))
	for body, h := range sent {
		m := parked[body]
		assert.Equal(t, "rk."+body, m.RoutingKey)
		for k, v := range h {
			assert.Equal(t, v, m.Headers[k], "%s: header %s", body, k)
		}
	}
	assert.Zero(t, env.Messages(q), "nothing reached the destination")
}
