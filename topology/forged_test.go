package topology_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// One message whose x-death header is an array of strings, published straight into a quorum
// delay level, stops dead-lettering on the whole node exactly on the versions that
// amqpx.DeadLetterWarning warns about (measured: 3.10.8 breaks, 4.0.5 does not; run it on
// both, see the README's broker versions). Broken, a delayed message stays in its level, and
// a work queue declared afterwards is refused (541) and left down; not broken, the delayed
// message arrives and the work queue is declared. Builder.Verify's probe of dead-lettering
// fails exactly when it broke. On a throwaway node of its own: never on
// a shared broker.
func TestForgedXDeathInALevel(t *testing.T) {
	node := testenv.StartNode(t)
	const dest = "forged.dest"
	b, err := topology.NewBuilder(topology.Config{Delay: topology.Delay{Levels: 3}}, nil)
	require.NoError(t, err)
	require.NoError(t, b.Apply(t.Context(), warren.Connection{URL: node.URL()}, topology.Topology{Queues: []topology.Queue{{Name: dest}}}))
	d := b.Delay()
	conn, _, err := amqpx.Dial(t.Context(), warren.Connection{URL: node.URL()}, "forged")
	require.NoError(t, err)
	defer conn.Close()
	version := amqpx.ServerVersion(conn)
	affected := amqpx.DeadLetterWarning(version) != ""

	start := time.Now()
	broken := node.BreakDeadLettering(d.LevelQueue(0, 1), dest)
	t.Logf("RabbitMQ %s: dead-lettering broken: %v (seen after %s)", version, broken, time.Since(start).Round(time.Millisecond))
	require.Equal(t, affected, broken, "RabbitMQ %s: DeadLetterWarning and the broker disagree", version)

	// A delayed message, published as the DLX publisher does: 0x12C ms waits in p2.d1,
	// p1.d2, p0.d12.
	ch, err := conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.Confirm(false))
	plan, err := d.Plan(300 * time.Millisecond)
	require.NoError(t, err)
	plan.Headers[contract.DestQueueHeader] = dest
	dc, err := ch.PublishWithDeferredConfirmWithContext(t.Context(), plan.Exchange, dest, true, false, amqp.Publishing{
		Headers: plan.Headers, Body: []byte("delayed"), DeliveryMode: amqp.Persistent,
	})
	require.NoError(t, err)
	require.True(t, dc.Wait(), "the delayed message is confirmed either way")
	arrived := func() bool {
		got, ok, err := ch.Get(dest, true)
		return err == nil && ok && string(got.Body) == "delayed"
	}
	if broken {
		// Not a wait for an event: the message must not arrive, and real time must pass
		// (its delay is 300 ms).
		time.Sleep(3 * time.Second)
		assert.False(t, arrived(), "a delayed message arrived although dead-lettering broke")
		// It waits in a level for good: in its first one, or a later one if it passed while
		// the dead-letter worker was being restarted. p0.d1 holds the forged message. The
		// broker counts a message its dead-letter worker holds (the message expired, it is
		// not ready) in the queue's statistics, which a quorum queue updates every few
		// seconds (measured on 3.10.8: 0 at 3 s, 1 at 4.4 s).
		levels, _ := d.Names()
		var rows []testenv.QueueRow
		assert.Eventually(t, func() bool {
			rows = node.ListQueues()
			held := 0
			for _, row := range rows {
				if slices.Contains(levels, row.Name) && row.Name != d.LevelQueue(0, 1) {
					held += row.Messages
				}
			}
			return held == 1
		}, testenv.Patience(), 250*time.Millisecond, "the delayed message waits in a level for good: %+v", rows)
	} else {
		require.Eventually(t, func() bool {
			for {
				got, ok, err := ch.Get(dest, true)
				if err != nil || !ok {
					return false
				}
				if string(got.Body) == "delayed" {
					return true
				}
			}
		}, testenv.Patience(), 50*time.Millisecond, "the delayed message arrives")
	}

	// A work queue declared now (once: a second declaration finds it and succeeds).
	later := topology.Queue{Name: "forged.later"}
	ch, err = conn.Channel()
	require.NoError(t, err)
	_, declared := ch.QueueDeclare(later.Name, true, false, false, false, b.QueueArgs(later))
	t.Logf("a work queue declared afterwards: %v", declared)
	want := "running"
	if broken {
		var ae *amqp.Error
		require.True(t, errors.As(declared, &ae), "refused: %v", declared)
		assert.Equal(t, amqp.InternalError, ae.Code)
		want = "down" // shown running for a moment after the refusal
	} else {
		require.NoError(t, declared)
	}
	assert.Eventually(t, func() bool {
		for _, row := range node.ListQueues() {
			if row.Name == later.Name {
				return row.State == want
			}
		}
		return false
	}, testenv.Patience(), 200*time.Millisecond, "the work queue declared afterwards is %s", want)

	// Verify sees it: the level queues that exist still run, but its probe of dead-lettering
	// fails.
	r, err := b.Verify(t.Context(), warren.Connection{URL: node.URL()}, topology.Topology{Queues: []topology.Queue{{Name: dest}}})
	require.NoError(t, err)
	t.Logf("verify: %s", r)
	assert.Empty(t, r.Missing)
	assert.Equal(t, broken, r.DeadLettering != "", "dead-lettering: %q", r.DeadLettering)
	assert.Equal(t, !broken, r.OK())
}
