package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/mgmt"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// status prints what is wrong first, a line each (a work queue without consumer, a policy
// that changes one of warren's queues), and the long warning of a hazardous broker version
// once, on stderr, not on stdout.
func TestStatusPrintsProblemsFirst(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	delay := cliDelay(env)
	q := env.WorkQueue("problems")
	mg := managementURL
	testenv.Policy(t, mg, q+".ttl", false, q, map[string]any{"message-ttl": 60000})
	args := []string{"status", q, "--management", mg, "--prefix", delay.Prefix, "--levels", fmt.Sprint(delay.Levels)}
	var stdout, stderr string
	// The broker's statistics tell a queue's policy after a few seconds.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var code int
		stdout, stderr, code = runCode(t, env.URL, args...)
		assert.Contains(c, stdout, "policy ", "exit %d, stderr: %s", code, stderr)
	}, testenv.Patience(), 500*time.Millisecond)
	t.Logf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	problems := stdout[:strings.Index(stdout, "QUEUE")]
	assert.Regexp(t, `^\d+ problems:\n`, problems)
	assert.Contains(t, problems, "  "+q+": no consumer\n")
	assert.Contains(t, problems, "  policy "+q+".ttl changes queue "+q+": message-ttl=60000\n")
	assert.Contains(t, problems, "  delay levels "+delay.Name()+" not declared\n")

	conn, _, err := amqpx.Dial(t.Context(), env.Connection(), "version")
	require.NoError(t, err)
	version := amqpx.ServerVersion(conn)
	_ = amqpx.Close(conn)
	if w := amqpx.DeadLetterWarning(version); w != "" {
		assert.Contains(t, problems, "  RabbitMQ "+version+" can stop dead-lettering on one malformed message\n")
		assert.NotContains(t, stdout, w)
		assert.Equal(t, "warning: "+w+"\n", stderr)
	} else {
		assert.Empty(t, stderr)
	}
}

// On a RabbitMQ 3.x node with few open files, `delays apply` refuses (unless --force) delay
// levels whose quorum queues would exhaust the node's file handles, declaring nothing, and
// warns at 80% of the limit; without the management API it says the limit is unchecked; `delays verify` warns of a policy that changes a level. On 4.x
// (which has no file handle cache) nothing of this applies: the test runs on the local
// installation (3.10.8), on a throwaway node of its own.
func TestDelaysApplyChecksFileHandles(t *testing.T) {
	node := testenv.StartNode(t, testenv.WithManagement(), testenv.WithOpenFiles(600))
	mg := node.ManagementURL()
	c, err := mgmt.New(mg)
	require.NoError(t, err)
	defer c.Close()
	// A node tells its limits with its first statistics, a few seconds after it started.
	require.Eventually(t, func() bool {
		ns, err := c.Nodes(t.Context())
		require.NoError(t, err)
		return len(ns) == 1 && ns[0].FDTotal != nil
	}, testenv.Patience(), 200*time.Millisecond)
	// Without the management API, an apply of many quorum queues says that the limit is
	// unchecked, and declares them: 6 levels, 91 queues, 273 handles of 600 open files' 503.
	stdout, stderr, code := runCode(t, node.URL(), "delays", "apply", "--levels", "6", "--prefix", "small")
	require.Equal(t, 0, code, stderr)
	assert.Contains(t, stderr, "note: RabbitMQ 3.10.8 holds 3 file handles per quorum queue, and this declares up to 91 of them; "+
		"its open-file limit is unchecked: give --management URL")
	assert.Contains(t, stdout, "declared delay levels small.")

	// The default levels, 194 more, would take it to about 855: refused, nothing declared.
	stdout, stderr, code = runCode(t, node.URL(), "delays", "apply", "--management", mg)
	t.Logf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	assert.Equal(t, 1, code)
	assert.Regexp(t, `warning: 194 new quorum queues would take \S+ to about 8\d\d file handles, past its limit of 503`, stderr)
	assert.Contains(t, stderr, "refused: declaring 194 quorum queues would exhaust the file handles of RabbitMQ 3.")
	qs, err := c.Queues(t.Context(), "/")
	require.NoError(t, err)
	assert.Len(t, qs, 91, "nothing more declared")

	// 4 levels, 61 queues, about 459 of 503 (91%): a warning, and declared.
	stdout, stderr, code = runCode(t, node.URL(), "delays", "apply", "--management", mg, "--levels", "4")
	t.Logf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	require.Equal(t, 0, code, stderr)
	assert.Regexp(t, `warning: 61 new quorum queues take \S+ to about 4\d\d of its 503 file handles`, stderr)
	assert.Contains(t, stdout, "declared delay levels warren.delay.")

	// A policy on a level: verify warns of it, and still passes.
	d := topology.Delay{Levels: 4}.WithDefaults()
	testenv.Policy(t, mg, "level-ttl", false, d.LevelQueue(0, 1), map[string]any{"message-ttl": 5})
	var out string
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		out, stderr, code = runCode(t, node.URL(), "delays", "verify", "--management", mg, "--levels", "4")
		assert.Contains(c, out, "policy level-ttl", "stderr: %s", stderr)
	}, testenv.Patience(), 500*time.Millisecond)
	assert.Equal(t, 0, code, stderr)
	assert.Contains(t, out, "warning: policy level-ttl changes queue "+d.LevelQueue(0, 1)+": message-ttl=5\n")
	assert.Regexp(t, `warning: \S+ holds about 4\d\d of its 503 file handles \(RabbitMQ 3.x: 3 per quorum queue, 152 quorum queues\)`, out)
}
