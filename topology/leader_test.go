package topology_test

import (
	"context"
	"math"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

const locatorArg = "x-queue-leader-locator"

func TestLeaderLocatorDefaultsAndOverrides(t *testing.T) {
	c := topology.Config{}.WithDefaults()
	assert.Equal(t, topology.LeaderLocator(""), c.LeaderLocator, "default: the broker's")
	assert.Equal(t, topology.LeaderLocator(""), c.Delay.LeaderLocator)
	assert.Equal(t, topology.LeaderLocator(""), topology.Delay{}.WithDefaults().LeaderLocator)

	c = topology.Config{LeaderLocator: topology.Balanced}.WithDefaults()
	assert.Equal(t, topology.Balanced, c.Delay.LeaderLocator, "the levels follow Config.LeaderLocator")
	c = topology.Config{LeaderLocator: topology.Balanced, Delay: topology.Delay{LeaderLocator: topology.ClientLocal}}.WithDefaults()
	assert.Equal(t, topology.ClientLocal, c.Delay.LeaderLocator, "an explicit Delay.LeaderLocator wins")
	assert.Equal(t, c, c.WithDefaults(), "idempotent")

	def, err := topology.NewBuilder(topology.Config{}, nil)
	require.NoError(t, err)
	assert.NotContains(t, def.QueueArgs(topology.Queue{Name: "q"}), locatorArg, "not declared by default")

	b, err := topology.NewBuilder(topology.Config{LeaderLocator: topology.Balanced}, nil)
	require.NoError(t, err)
	assert.Equal(t, "balanced", b.QueueArgs(topology.Queue{Name: "q"})[locatorArg])
	assert.Equal(t, "client-local", b.QueueArgs(topology.Queue{Name: "q", Args: amqp.Table{locatorArg: "client-local"}})[locatorArg],
		"Queue.Args win")
	assert.NotContains(t, b.QueueArgs(topology.Queue{Name: "q", Type: topology.Classic}), locatorArg, "never on a classic queue")
}

func TestLeaderLocatorValidationNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		cfg  topology.Config
		want string
	}{
		{topology.Config{LeaderLocator: "random"},
			`topology: Config.LeaderLocator "random" is not one of "" (the broker's default), "client-local", "balanced"`},
		{topology.Config{LeaderLocator: "Balanced"},
			`topology: Config.LeaderLocator "Balanced" is not one of`},
		{topology.Config{Delay: topology.Delay{LeaderLocator: "least-leaders"}},
			`topology: Delay.LeaderLocator "least-leaders" is not one of`},
	} {
		_, err := topology.NewBuilder(tc.cfg, nil)
		assert.ErrorContains(t, err, tc.want)
	}
	assert.ErrorContains(t, topology.Delay{LeaderLocator: "min-masters"}.Validate(), "Delay.LeaderLocator")
	for _, l := range []topology.LeaderLocator{"", topology.ClientLocal, topology.Balanced} {
		assert.NoError(t, topology.Config{LeaderLocator: l}.Validate(), "%q", l)
	}
}

// refused declares queue again with args on a channel of its own and reports the broker's
// refusal (the channel is closed by it).
func refused(t *testing.T, env *testenv.Env, queue string, args amqp.Table) error {
	t.Helper()
	_, err := env.Channel().QueueDeclare(queue, true, false, false, false, args)
	return err
}

func with(args amqp.Table, k string, v any) amqp.Table {
	out := amqp.Table{}
	for a, b := range args {
		out[a] = b
	}
	out[k] = v
	return out
}

// Config.LeaderLocator balanced is declared on every quorum queue: work, poison, parking and
// level queues. The broker compares the argument, so a declaration with exactly these
// arguments is accepted and one with the other value refused.
func TestLeaderLocatorIsDeclaredOnEveryQuorumQueue(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.Queue("work")
	b := newBuilder(t, env, topology.Config{LeaderLocator: topology.Balanced, Delay: topology.Delay{Levels: 2}})
	require.NoError(t, b.Declare(context.Background(), env.Channel(), topology.Topology{Queues: []topology.Queue{{Name: q}}}))
	d := b.Delay()
	assert.Equal(t, topology.Balanced, d.LeaderLocator)

	declared := map[string]amqp.Table{
		q: {"x-queue-type": "quorum", "x-delivery-limit": int64(20),
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": topology.PoisonQueue(q),
			"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"},
		topology.PoisonQueue(q): {"x-queue-type": "quorum", "x-delivery-limit": int64(math.MaxInt32)},
		d.ParkingQueue():        {"x-queue-type": "quorum", "x-delivery-limit": int64(math.MaxInt32)},
		d.LevelQueue(1, 3): {"x-queue-type": "quorum", "x-message-ttl": d.TTL(1, 3).Milliseconds(),
			"x-dead-letter-exchange": d.LevelExchange(0), "x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"},
	}
	for queue, args := range declared {
		redeclare(t, env, queue, with(args, locatorArg, "balanced"))
		err := refused(t, env, queue, with(args, locatorArg, "client-local"))
		assert.ErrorContains(t, err, "inequivalent arg '"+locatorArg+"'", "queue %s", queue)
		assert.ErrorContains(t, refused(t, env, queue, args), "inequivalent arg '"+locatorArg+"'", "queue %s", queue)
	}

	// Declaring again, and verifying, with the same configuration changes nothing.
	require.NoError(t, b.Declare(context.Background(), env.Channel(), topology.Topology{Queues: []topology.Queue{{Name: q}}}))
	r, err := b.Verify(context.Background(), env.Connection(), topology.Topology{Queues: []topology.Queue{{Name: q}}})
	require.NoError(t, err)
	assert.True(t, r.OK(), "%s", r)
}

// With the default (no x-queue-leader-locator), queues that exist as an earlier version of
// warren declared them are declared again unchanged; switching to balanced on them is a
// MismatchError naming the argument and what to do, for the levels and the work queues.
func TestLeaderLocatorOnExistingQueues(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.Queue("work")
	top := topology.Topology{Queues: []topology.Queue{{Name: q}}}
	delay := topology.Delay{Levels: 1}
	old := newBuilder(t, env, topology.Config{Delay: delay})
	require.NoError(t, old.Declare(context.Background(), env.Channel(), top))
	// An x-queue-leader-locator would make these refused: nothing was added.
	redeclare(t, env, old.Delay().ParkingQueue(), amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": int64(math.MaxInt32)})
	require.NoError(t, old.Declare(context.Background(), env.Channel(), top), "the default declares them again unchanged")

	balanced := newBuilder(t, env, topology.Config{Delay: delay, LeaderLocator: topology.Balanced})
	require.Equal(t, old.Delay().Name(), balanced.Delay().Name(), "the same levels")
	err := balanced.Declare(context.Background(), env.Channel(), top)
	var m *topology.MismatchError
	require.ErrorAs(t, err, &m)
	assert.Equal(t, old.Delay().ParkingQueue(), m.Name, "the levels come first")
	assert.Equal(t, "argument "+locatorArg, m.Argument)
	assert.Empty(t, m.Existing, "the type is not what differs")
	assert.Contains(t, m.Hint, "set Delay.LeaderLocator (or Config.LeaderLocator)")

	// Verify names every queue that differs, each with its hint.
	r, err := balanced.Verify(context.Background(), env.Connection(), top)
	require.NoError(t, err)
	differs := map[string]*topology.MismatchError{}
	for _, d := range r.Differs {
		differs[d.Name] = d
		assert.Equal(t, "argument "+locatorArg, d.Argument, d.Name)
	}
	assert.Len(t, r.Differs, 3+old.Delay().QueueCount(), "work, poison, parking and level queues")
	require.Contains(t, differs, q)
	assert.Contains(t, differs[q].Hint, "set Config.LeaderLocator (or x-queue-leader-locator in Queue.Args)")
	assert.Contains(t, differs[q].Hint, "rabbitmq-queues rebalance quorum")
	require.Contains(t, differs, topology.PoisonQueue(q))
	assert.Contains(t, differs[topology.PoisonQueue(q)].Hint, "set Config.LeaderLocator")

	// Only the work queues balanced, the levels left as they are: the work queue is refused.
	work := newBuilder(t, env, topology.Config{Delay: topology.Delay{Levels: 1, Disabled: true}, LeaderLocator: topology.Balanced})
	err = work.DeclareQueue(context.Background(), env.Channel(), topology.Queue{Name: q})
	require.ErrorAs(t, err, &m)
	assert.Equal(t, q, m.Name)
	assert.Contains(t, err.Error(), `queue "`+q+`" exists with a different argument `+locatorArg+`: the leader locator only places a queue when it is created`)
}

// Classic queues are declared without a leader locator, whatever Config.LeaderLocator says:
// RabbitMQ 3.10 refuses x-queue-leader-locator on a classic queue.
func TestLeaderLocatorNotOnClassicQueues(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("work")
	b := newBuilder(t, env, topology.Config{QueueType: topology.Classic, LeaderLocator: topology.Balanced, Delay: topology.Delay{Levels: 1}})
	require.NoError(t, b.Declare(context.Background(), env.Channel(), topology.Topology{Queues: []topology.Queue{{Name: q}}}))
	redeclare(t, env, q, amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": topology.PoisonQueue(q)})
	redeclare(t, env, topology.PoisonQueue(q), nil)
	redeclare(t, env, b.Delay().ParkingQueue(), amqp.Table{"x-queue-type": "classic", "x-queue-version": int32(2)})
}

// An existing classic work queue is still reported as a classic queue (x-queue-type) when
// warren declares quorum queues with a leader locator.
func TestExistingClassicWorkQueueWithLeaderLocator(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.Queue("old")
	ch := env.Channel()
	_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{
		"x-dead-letter-exchange": "", "x-dead-letter-routing-key": topology.PoisonQueue(q)})
	require.NoError(t, err)
	b := newBuilder(t, env, topology.Config{LeaderLocator: topology.Balanced, Delay: topology.Delay{Levels: 1}})
	err = b.DeclareQueue(context.Background(), env.Channel(), topology.Queue{Name: q})
	var m *topology.MismatchError
	require.ErrorAs(t, err, &m)
	assert.Equal(t, q, m.Name)
	assert.Equal(t, topology.Classic, m.Existing, "%v", err)
	assert.Equal(t, "argument x-queue-type", m.Argument)

	// A classic poison queue alone too.
	q2 := env.Queue("oldpoison")
	_, err = env.Channel().QueueDeclare(topology.PoisonQueue(q2), true, false, false, false, nil)
	require.NoError(t, err)
	err = b.DeclareQueue(context.Background(), env.Channel(), topology.Queue{Name: q2})
	require.ErrorAs(t, err, &m)
	assert.Equal(t, topology.PoisonQueue(q2), m.Name)
	assert.Equal(t, topology.Classic, m.Existing, "%v", err)
}
