package ops_test

import (
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
)

// With the management API, Status reads the broker's nodes (running, their limits; on
// RabbitMQ 3.x the file handles of their quorum queues) and the policies that change
// warren's queues: a policy on a work queue and an operator policy on its poison queue, set
// for this test's queues alone, are problems; a policy on a queue of someone else's is not.
func TestStatusReadsTheBrokersHealth(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	delay := env.Delay(topology.Delay{Disabled: true})
	q := env.WorkQueue("health")
	other := env.Queue("other")
	_, err := env.Channel().QueueDeclare(other, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum})
	require.NoError(t, err)
	mg := testenv.ManagementURL()
	testenv.Policy(t, mg, q+".limit", false, q, map[string]any{"delivery-limit": 5, "message-ttl": 60000})
	testenv.Policy(t, mg, q+".cap", true, topology.PoisonQueue(q), map[string]any{"max-length": 1000})
	testenv.Policy(t, mg, other+".limit", false, other, map[string]any{"delivery-limit": 5})

	o := newOpsWith(t, env.URL, mg, delay)
	var s ops.Status
	// The broker's statistics tell a queue's policies after a few seconds.
	require.Eventually(t, func() bool {
		s, err = o.Status(t.Context(), q)
		require.NoError(t, err)
		return s.Broker != nil && len(s.Broker.Policies) == 2
	}, testenv.Patience(), 200*time.Millisecond, "last: %+v", s.Broker)
	assert.Equal(t, []ops.PolicyWarning{
		{Queue: q, Policy: q + ".limit", Keys: []string{"delivery-limit=5", "message-ttl=60000"}},
		{Queue: topology.PoisonQueue(q), OperatorPolicy: q + ".cap", Keys: []string{"max-length=1000"}},
	}, s.Broker.Policies)
	var texts []string
	for _, p := range s.Problems() {
		if p.Kind == ops.ProblemBroker {
			texts = append(texts, p.Text)
		}
	}
	assert.Contains(t, texts, "policy "+q+".limit changes queue "+q+": delivery-limit=5, message-ttl=60000")
	assert.Contains(t, texts, "operator policy "+q+".cap changes queue "+topology.PoisonQueue(q)+": max-length=1000")
	assert.NotContains(t, strings.Join(texts, "\n"), other)

	require.NotEmpty(t, s.Broker.Nodes)
	for _, n := range s.Broker.Nodes {
		assert.True(t, n.Running)
		assert.Positive(t, n.FDTotal)
		assert.Positive(t, n.MemLimit)
		if amqpx.FileHandleCache(s.ServerVersion) {
			assert.Equal(t, n.FDTotal-97, n.FileHandleLimit, "3.x")
			assert.GreaterOrEqual(t, n.FileHandles, ops.FileHandlesPerQuorumQueue*n.QuorumQueues)
		} else {
			assert.Zero(t, n.FileHandleLimit, "4.x has no file handle cache")
			assert.Zero(t, n.FileHandles)
		}
	}

	// Checking what declaring queues would take counts those that do not exist yet.
	c, err := o.CheckFileHandles(t.Context(), []string{q, topology.PoisonQueue(q), env.Queue("new")})
	require.NoError(t, err)
	assert.Equal(t, s.ServerVersion, c.ServerVersion)
	if c.Cache {
		assert.Equal(t, 1, c.New)
		assert.NotEmpty(t, c.Nodes)
		assert.False(t, c.Exhausts)
	} else {
		assert.Equal(t, -1, c.New, "4.x: not counted")
	}
}
