package topology_test

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// The arguments whose fate depends on the broker's version are decided for that version:
// x-max-priority on a quorum queue is refused, with what the version offers instead, up to
// 4.3 and left to a later (or unknown) version; x-consumer-timeout is refused where the
// broker ignores it (before 3.12) and on a classic queue from 4.3, and accepted otherwise.
func TestValidateForFollowsTheBrokerVersion(t *testing.T) {
	const (
		noPriority = "whose messages have no priority before 4.0"
		two        = "two levels: a priority above 4 goes first"
		thirtyTwo  = "32 levels, 0–31"
		ignored    = "ignores it: a consumer timeout per queue needs RabbitMQ 3.12"
		classic43  = "refuses it on a classic queue: from 4.3 only quorum queues have a consumer timeout"
	)
	for _, c := range []struct {
		typ     topology.QueueType
		arg     string
		version string
		want    string
	}{
		{topology.Quorum, "x-max-priority", "3.10.8", noPriority},
		{topology.Quorum, "x-max-priority", "3.13.7", noPriority},
		{topology.Quorum, "x-max-priority", "4.0.5", two},
		{topology.Quorum, "x-max-priority", "4.2.3", two},
		{topology.Quorum, "x-max-priority", "4.3.0", thirtyTwo},
		{topology.Quorum, "x-max-priority", "4.3.5+1.g0abc", thirtyTwo},
		{topology.Quorum, "x-max-priority", "4.4.0", ""},
		{topology.Quorum, "x-max-priority", "", ""},
		{topology.Quorum, "x-max-priority", "unknown", ""},
		{topology.Classic, "x-max-priority", "3.10.8", ""},
		{topology.Classic, "x-max-priority", "4.3.0", ""},

		{topology.Quorum, "x-consumer-timeout", "3.10.8", ignored},
		{topology.Quorum, "x-consumer-timeout", "3.11.28", ignored},
		{topology.Quorum, "x-consumer-timeout", "3.12.0", ""},
		{topology.Quorum, "x-consumer-timeout", "4.0.5", ""},
		{topology.Quorum, "x-consumer-timeout", "4.3.0", ""},
		{topology.Classic, "x-consumer-timeout", "3.10.8", ignored},
		{topology.Classic, "x-consumer-timeout", "4.0.5", ""},
		{topology.Classic, "x-consumer-timeout", "4.2.0", ""},
		{topology.Classic, "x-consumer-timeout", "4.3.0", classic43},
		{topology.Classic, "x-consumer-timeout", "", ""},
	} {
		top := topology.Topology{Queues: []topology.Queue{{Name: "q", Type: c.typ, Args: amqp.Table{c.arg: int64(5)}}}}
		require.NoError(t, top.ValidateWith(topology.Config{}), "without a version, %s is left to the broker", c.arg)
		err := top.ValidateFor(topology.Config{}, c.version)
		if c.want == "" {
			assert.NoError(t, err, "%s on %s, RabbitMQ %q", c.arg, c.typ, c.version)
			continue
		}
		assert.ErrorContains(t, err, c.want, "%s on %s, RabbitMQ %q", c.arg, c.typ, c.version)
		assert.ErrorContains(t, err, `Queues[0].Args["`+c.arg+`"] of `+string(c.typ)+` queue "q": RabbitMQ `+c.version+" ")
	}
}

// On the broker the tests run against (3.10.8 and 4.0.5 in CI): Apply and Verify check the
// arguments for its version before declaring anything, and the rule is the broker's own
// (it refuses x-max-priority on a quorum queue itself); a Builder that does not know the
// version leaves it to the broker, whose refusal is reported as one (not as a queue that
// exists with other arguments). x-consumer-timeout is declared from 3.12 and refused before.
func TestApplyChecksArgumentsForTheBrokerVersion(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	conn, err := env.Dial()
	require.NoError(t, err)
	version := amqpx.ServerVersion(conn)
	_ = conn.Close()
	major, minor, ok := amqpx.MajorMinor(version)
	require.True(t, ok, "version %q", version)
	b := newBuilder(t, env, topology.Config{})

	prio := env.Queue("prio")
	top := topology.Topology{Queues: []topology.Queue{{Name: prio, Args: amqp.Table{"x-max-priority": int64(5)}}}}
	err = b.Apply(t.Context(), env.Connection(), top)
	require.ErrorContains(t, err, "RabbitMQ "+version+" refuses it on a quorum queue")
	_, err = b.Verify(t.Context(), env.Connection(), top)
	require.ErrorContains(t, err, "RabbitMQ "+version+" refuses it on a quorum queue")
	assert.False(t, exists(env, prio), "nothing declared")

	ch := env.Channel()
	_, err = ch.QueueDeclare(prio, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum, "x-max-priority": int64(5)})
	require.ErrorContains(t, err, "PRECONDITION_FAILED", "RabbitMQ %s refuses x-max-priority on a quorum queue", version)

	err = b.DeclareQueue(t.Context(), env.Channel(), top.Queues[0])
	require.ErrorContains(t, err, "RabbitMQ refuses argument x-max-priority on a quorum queue")
	assert.False(t, topology.IsMismatch(err), "no queue exists")

	timeout := env.Queue("timeout")
	top = topology.Topology{Queues: []topology.Queue{{Name: timeout, Args: amqp.Table{"x-consumer-timeout": int64(60000)}}}}
	err = b.Apply(t.Context(), env.Connection(), top)
	if major > 3 || major == 3 && minor >= 12 {
		require.NoError(t, err)
		assert.True(t, exists(env, timeout))
		return
	}
	require.ErrorContains(t, err, "RabbitMQ "+version+" ignores it")
	assert.False(t, exists(env, timeout), "nothing declared")
}

// exists tells whether queue exists.
func exists(env *testenv.Env, queue string) bool {
	_, err := env.Inspect(queue)
	return err == nil
}
