package ops_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
)

// newOpsWith returns an Ops on url with the management API at management, closed when the
// test ends.
func newOpsWith(t *testing.T, url, management string, delay topology.Delay) *ops.Ops {
	t.Helper()
	o, err := ops.New(ops.Config{Connection: warren.Connection{URL: url}, Delay: delay, Management: management}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = o.Close() })
	return o
}

// With the management API, Status reports a work queue's state, its unacknowledged messages
// and its consumer's host, and WorkQueues lists it (not its poison queue); without it, they
// are unknown, and WorkQueues says so. Either way Status names the broker's version and its
// dead-lettering warning, if any. A missing management API fails the test.
func TestStatusWithManagement(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	delay := env.Delay(topology.Delay{Disabled: true})
	q := env.WorkQueue("mgmt")
	ch := env.Channel()
	for range 3 {
		require.NoError(t, ch.PublishWithContext(t.Context(), "", q, false, false, amqp.Publishing{Body: []byte("x")}))
	}
	require.NoError(t, ch.Qos(1, 0, false))
	_, err := ch.Consume(q, "", false, false, false, false, nil) // holds one unacknowledged
	require.NoError(t, err)

	o := newOpsWith(t, env.URL, testenv.ManagementURL(), delay)
	var s ops.Status
	// The management API's statistics arrive every few seconds.
	require.Eventually(t, func() bool {
		s, err = o.Status(t.Context(), q)
		require.NoError(t, err, "the management API must answer at %s (make broker enables it)", testenv.ManagementURL())
		return s.Queues[0].State != "unknown" && s.Queues[0].Unacked == 1 && len(s.Queues[0].ConsumerHosts) == 1
	}, testenv.Patience(), 200*time.Millisecond, "last: %+v", s.Queues)
	got := s.Queues[0]
	assert.True(t, s.Management)
	assert.Equal(t, "running", got.State)
	assert.False(t, got.Unavailable())
	assert.Equal(t, 2, got.Ready)
	assert.Equal(t, 1, got.Consumers)
	assert.Equal(t, []string{"127.0.0.1"}, got.ConsumerHosts)
	assert.NotEmpty(t, s.ServerVersion)
	assert.Equal(t, amqpx.DeadLetterWarning(s.ServerVersion), s.Warning)

	queues, err := o.WorkQueues(t.Context())
	require.NoError(t, err)
	assert.Contains(t, queues, q)
	assert.NotContains(t, queues, topology.PoisonQueue(q))

	plain := newOps(t, env.URL, delay)
	s, err = plain.Status(t.Context(), q)
	require.NoError(t, err)
	assert.False(t, s.Management)
	assert.Equal(t, ops.QueueStatus{Queue: q, Exists: true, Ready: 2, Unacked: -1, Consumers: 1, Poison: 0}, s.Queues[0])
	_, err = plain.WorkQueues(t.Context())
	assert.ErrorIs(t, err, ops.ErrNoManagement)
}

// On a node whose dead-lettering a forged message stopped (RabbitMQ 3.10.8), Status shows a
// work queue declared afterwards as down, never as 0 ready, and counts the delayed messages
// held in their level, which a passive declare (AMQP) counts as 0. On a version that is not
// affected (4.0.5), both are running and nothing stays dead-lettering. On a throwaway node of
// its own.
func TestStatusSeesABrokerThatCannotDeadLetter(t *testing.T) {
	node := testenv.StartNode(t, testenv.WithManagement())
	const q = "status.work"
	b, err := topology.NewBuilder(topology.Config{Delay: topology.Delay{Levels: 3}}, nil)
	require.NoError(t, err)
	require.NoError(t, b.Apply(t.Context(), warren.Connection{URL: node.URL()}, topology.Topology{Queues: []topology.Queue{{Name: q}}}))
	d := b.Delay()
	broken := node.BreakDeadLettering(d.LevelQueue(0, 1), q)

	const later = "status.later" // declared after the crash: refused with 541, left down
	conn, err := amqp.Dial(node.URL())
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, declared := ch.QueueDeclare(later, true, false, false, false, b.QueueArgs(topology.Queue{Name: later}))
	require.Equal(t, broken, declared != nil, "declare %s: %v", later, declared)

	o := newOpsWith(t, node.URL(), node.ManagementURL(), d)
	var s ops.Status
	require.Eventually(t, func() bool {
		s, err = o.Status(t.Context(), q, later)
		require.NoError(t, err)
		return s.Queues[1].Exists && s.Queues[0].State != "unknown" && s.Queues[1].State != "unknown" &&
			s.Delay.Levels[0].State != "unknown" &&
			(!broken || s.Delay.DeadLettering > 0)
	}, testenv.Patience(), 200*time.Millisecond, "last: %+v %+v", s.Queues, s.Delay)
	t.Logf("RabbitMQ %s, broken: %v: %+v; levels: %d waiting, %d dead-lettering", s.ServerVersion, broken, s.Queues, s.Delay.Waiting, s.Delay.DeadLettering)
	plain, err := newOps(t, node.URL(), d).Status(t.Context(), later)
	require.NoError(t, err)
	if broken {
		assert.NotEmpty(t, s.Warning)
		assert.Equal(t, "down", s.Queues[1].State)
		assert.True(t, s.Queues[1].Unavailable())
		assert.Equal(t, 0, plain.Queues[0].Ready, "AMQP's passive declare counts a down queue as empty")
		assert.Equal(t, 1, s.Delay.DeadLettering, "the forged message, held in its level")
		assert.Equal(t, 1, s.Delay.Waiting)
		assert.Equal(t, 0, plain.Delay.Waiting, "AMQP's passive declare does not count it")
	} else {
		assert.Empty(t, s.Warning)
		assert.Equal(t, "running", s.Queues[1].State)
		assert.Zero(t, s.Delay.DeadLettering)
	}
	assert.Equal(t, "running", s.Queues[0].State)
	assert.Zero(t, s.Delay.Unavailable)
}
