package topology_test

import (
	"context"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// A field or argument that the queue's type would ignore, or that warren sets itself, is an
// error naming the entry and the field; so is a delivery limit of a file whose queues are
// all classic.
func TestValidateWithNamesWhatTheQueueTypeIgnores(t *testing.T) {
	quorum, classic := topology.Config{}, topology.Config{QueueType: topology.Classic}
	for _, c := range []struct {
		cfg  topology.Config
		q    topology.Queue
		want string
	}{
		{quorum, topology.Queue{Name: "q", Type: topology.Classic, DeliveryLimit: 7},
			`Queues[1].DeliveryLimit 7: queue "q" is classic, which has no delivery limit (it would be ignored)`},
		{classic, topology.Queue{Name: "q", DeliveryLimit: 7}, `Queues[1].DeliveryLimit 7: queue "q" is classic`},
		{quorum, topology.Queue{Name: "q", DeliveryLimit: 7}, ""},
		{classic, topology.Queue{Name: "q", Type: topology.Quorum, DeliveryLimit: 7}, ""},
		{quorum, topology.Queue{Name: "q", Args: amqp.Table{"x-delivery-limit": 3}},
			`Queues[1].Args["x-delivery-limit"] of quorum queue "q": warren sets it from Queue.DeliveryLimit`},
		{quorum, topology.Queue{Name: "q", Args: amqp.Table{"x-queue-type": "classic"}}, `Args["x-queue-type"] of quorum queue "q": warren sets it from Queue.Type`},
		{quorum, topology.Queue{Name: "q", Args: amqp.Table{"x-overflow": "drop-head"}}, `Args["x-overflow"] of quorum queue "q": warren sets it`},
		{quorum, topology.Queue{Name: "q", Args: amqp.Table{"x-dead-letter-exchange": "x"}}, `Args["x-dead-letter-exchange"] of quorum queue "q": warren sets it`},
		{quorum, topology.Queue{Name: "q", Args: amqp.Table{"x-queue-mode": "lazy"}}, "a classic queue's argument, which RabbitMQ refuses on a quorum queue"},
		{quorum, topology.Queue{Name: "q", Args: amqp.Table{"x-max-priority": 5}}, ""}, // depends on the version: ValidateFor
		{classic, topology.Queue{Name: "q", Args: amqp.Table{"x-quorum-target-group-size": 3}}, "which RabbitMQ ignores on a classic queue"},
		{classic, topology.Queue{Name: "q", Args: amqp.Table{"x-delivery-limit": 3}}, "a quorum queue's argument, which RabbitMQ refuses on a classic queue"},
		{classic, topology.Queue{Name: "q", Args: amqp.Table{"x-overflow": "reject-publish", "x-max-length": 1}}, ""},
		{quorum, topology.Queue{Name: "q", Args: amqp.Table{"x-queue-leader-locator": "balanced", "x-max-length": 1}}, ""},
	} {
		top := topology.Topology{Queues: []topology.Queue{{Name: "ok"}, c.q}}
		err := top.ValidateWith(c.cfg)
		if c.want == "" {
			assert.NoError(t, err, "%+v", c.q)
			continue
		}
		assert.ErrorContains(t, err, c.want, "%+v", c.q)
		_, err = topology.NewBuilder(c.cfg, nil)
		require.NoError(t, err)
	}

	for data, want := range map[string]string{
		"queues: [{name: q, type: classic, delivery_limit: 5}]":                               `Queues[0].DeliveryLimit 5: queue "q" is classic`,
		"config: {queue_type: classic, delivery_limit: 5}\nqueues: [{name: q}]":               "Config.DeliveryLimit 5: the queue type is classic and no work queue of the file is quorum",
		"config: {queue_type: classic, delivery_limit: 5}\nqueues: [{name: q, type: quorum}]": "",
		"config: {delivery_limit: 5}":                                                         "",
	} {
		_, err := topology.Parse([]byte(data))
		if want == "" {
			assert.NoError(t, err, data)
			continue
		}
		assert.ErrorContains(t, err, want, data)
	}
	_, err := topology.Load(exampleFile)
	assert.NoError(t, err)
}

// Apply refuses a topology with a binding to a queue that neither it nor the broker has,
// before it declares anything; Verify reports the binding. A name the broker has (amq.topic)
// needs no declaration.
func TestApplyChecksBindingsFirst(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	b := newBuilder(t, env, topology.Config{})
	x, q, typo := env.Exchange("events"), env.Queue("billing"), env.Queue("biling")
	top := topology.Topology{
		Exchanges: []topology.Exchange{{Name: x}},
		Queues:    []topology.Queue{{Name: q}},
		Bindings: []topology.Binding{
			{Exchange: x, Queue: q, Key: "a"},
			{Exchange: "amq.topic", Queue: q, Key: "b"},
			{Exchange: x, Queue: typo, Key: "c"},
		},
	}
	err := b.Apply(context.Background(), env.Connection(), top)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `topology: nothing declared: Bindings[2].Queue: queue "`+typo+`" is declared neither by the topology nor on the broker`)
	_, err = env.Inspect(q)
	assert.ErrorContains(t, err, "NOT_FOUND", "apply declared something")

	r, err := b.Verify(context.Background(), env.Connection(), top)
	require.NoError(t, err)
	assert.False(t, r.OK())
	assert.Equal(t, []string{`Bindings[2].Queue: queue "` + typo + `" is declared neither by the topology nor on the broker`}, r.Unresolved)
	assert.Contains(t, r.String(), "unresolved: Bindings[2].Queue: queue")

	top.Bindings = top.Bindings[:2]
	require.NoError(t, b.Apply(context.Background(), env.Connection(), top))
	r, err = b.Verify(context.Background(), env.Connection(), top)
	require.NoError(t, err)
	assert.True(t, r.OK(), r.String())
}
