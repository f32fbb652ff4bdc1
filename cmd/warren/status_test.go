package main

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// Without the management API, status says so in one line and, given no queue, how to name
// them; a broker version that one message can stop dead-lettering is warned about.
//
// Not parallel: it unsets $WARREN_MANAGEMENT_URL.
func TestStatusWithoutManagement(t *testing.T) {
	env := testenv.New(t)
	t.Setenv("WARREN_MANAGEMENT_URL", "")
	delay := cliDelay(env)
	out := run(t, env.URL, "status", "--prefix", delay.Prefix, "--levels", fmt.Sprint(delay.Levels))
	t.Log("\n" + out)
	assert.Contains(t, out, "no work queue named: give their names (warren status QUEUE...), a topology file (--config FILE),\n"+
		"or the management API (--management URL or $WARREN_MANAGEMENT_URL) to list warren's work queues\n")
	assert.Equal(t, 1, strings.Count(out, "management API: not given"), "one line")
	conn, _, err := amqpx.Dial(t.Context(), env.Connection(), "version")
	require.NoError(t, err)
	version := amqpx.ServerVersion(conn)
	_ = amqpx.Close(conn)
	if w := amqpx.DeadLetterWarning(version); w != "" {
		assert.Contains(t, out, "warning: "+w+"\n")
	} else {
		assert.NotContains(t, out, "warning:")
	}
}

// With the management API and no queue named, status lists warren's work queues, with their
// state, unacked messages and consumers' hosts. On a node whose dead-lettering a forged
// message stopped (3.10.8), a work queue declared afterwards shows as down (no count), the
// delayed message held in its level as dead-lettering, and `delays verify` fails on a level
// declared afterwards, which is down, and, without the management API too, on its probe of
// dead-lettering; on 4.0.5 all of them run and verify passes. On a
// throwaway node of its own.
func TestStatusListsWorkQueuesAndShowsWhatIsDown(t *testing.T) {
	node := testenv.StartNode(t, testenv.WithManagement())
	mg := node.ManagementURL()
	b, err := topology.NewBuilder(topology.Config{Delay: topology.Delay{Levels: 3}}, nil)
	require.NoError(t, err)
	d := b.Delay()
	levels := []string{"--levels", "3"}
	require.NoError(t, b.Apply(t.Context(), warren.Connection{URL: node.URL()}, topology.Topology{Queues: []topology.Queue{{Name: "cli.work"}}}))
	broken := node.BreakDeadLettering(d.LevelQueue(0, 1), "cli.work")
	// A work queue declared now, and a level queue deleted and declared again: refused once
	// (541) and left down on a broken node; then declared.
	run(t, node.URL(), "topology", "apply", writeFile(t, d, "cli.events", "cli.later", 20))
	_, err = node.Ctl("delete_queue", d.LevelQueue(1, 3))
	require.NoError(t, err)
	run(t, node.URL(), append([]string{"delays", "apply"}, levels...)...)

	var out string
	// The management API's statistics arrive every few seconds.
	require.Eventually(t, func() bool {
		out = run(t, node.URL(), append([]string{"status", "--management", mg}, levels...)...)
		return !strings.Contains(out, "unknown") && strings.Contains(out, "cli.later") &&
			(!broken || strings.Contains(out, "dead-lettering") && strings.Contains(out, "not running"))
	}, testenv.Patience(), 500*time.Millisecond, "last:\n%s", out)
	t.Logf("broken: %v\n%s", broken, out)
	assert.NotContains(t, out, "management API: not given")
	assert.NotContains(t, out, "no work queue named")
	assert.Regexp(t, regexp.MustCompile(`QUEUE\s+STATE\s+READY\s+UNACKED\s+CONSUMERS\s+KILL\s+POISON\s+CONSUMER HOSTS\n`), out)
	assert.Regexp(t, regexp.MustCompile(`\ncli.work\s+running\s+\d+\s+0\s+0\s+-\s+0\s+-\n`), out)
	assert.NotContains(t, out, ".poison ", "a poison queue is no work queue")
	vout, verr := cliErr(node.URL(), append([]string{"delays", "verify", "--management", mg}, levels...)...)
	t.Logf("delays verify: %v\n%s", verr, vout)
	if broken {
		assert.Contains(t, out, "warning: RabbitMQ ")
		assert.Regexp(t, regexp.MustCompile(`\ncli.later\s+down\s+-\s+-\s+0\s+-\s+0\s+-\n`), out)
		assert.Contains(t, out, "1 waiting, 0 parked, 1 dead-lettering, 1 of 45 level queues not running\n")
		assert.Contains(t, out, "  p0.d1 (1ms): 1 (1 dead-lettering)\n")
		assert.Contains(t, out, "  p1.d3 (48ms): down, its messages uncounted\n")
		require.Error(t, verr)
		assert.Contains(t, verr.Error(), "not running (management API): queue")
		assert.Contains(t, vout, "dead-lettering: the broker refused a quorum queue that dead-letters")
		assert.Contains(t, vout, fmt.Sprintf("not running: queue %q (down)\n", d.LevelQueue(1, 3)))
	} else {
		assert.NotContains(t, out, "warning:")
		assert.Regexp(t, regexp.MustCompile(`\ncli.later\s+running\s+0\s+0\s+0\s+-\s+0\s+-\n`), out)
		assert.NotContains(t, out, "down")
		require.NoError(t, verr)
	}
	// Without the management API too, verify's probe of dead-lettering sees it.
	pout, perr := cliErr(node.URL(), append([]string{"delays", "verify"}, levels...)...)
	t.Logf("delays verify without the management API: %v\n%s", perr, pout)
	if broken {
		require.Error(t, perr)
		assert.Contains(t, perr.Error(), "dead-lettering does not work")
		assert.Contains(t, pout, "dead-lettering: the broker refused a quorum queue that dead-letters")
	} else {
		require.NoError(t, perr)
	}
}
