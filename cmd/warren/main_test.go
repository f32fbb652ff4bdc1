package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

func run(t *testing.T, url string, args ...string) string {
	t.Helper()
	return runContext(context.Background(), t, url, args...)
}

// runContext is run with ctx as the command's context (which an interrupt would end).
func runContext(ctx context.Context, t *testing.T, url string, args ...string) string {
	t.Helper()
	root := newRoot()
	var out syncBuffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(cliArgs(url, args...))
	require.NoError(t, root.ExecuteContext(ctx), out.String())
	return out.String()
}

// runCode runs warren with args against url and returns what it printed on stdout and
// stderr, and its exit code.
func runCode(t *testing.T, url string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	root := newRoot()
	var out, errOut syncBuffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(cliArgs(url, args...))
	code = exitCode(root.Execute())
	return out.String(), errOut.String(), code
}

// startRouter runs a router with one handler on queue, its consumers obeying kill commands
// signed with secret (any, if empty), until the test ends; onKill, if not nil, is told its
// kill events. It returns once the handler consumes and listens to its kill topic.
func startRouter(t *testing.T, env *testenv.Env, queue, secret string, onKill func(router.KillEvent)) {
	t.Helper()
	r, err := router.New(router.Config{
		Connection: env.Connection(),
		KillSecret: []byte(secret), OnKill: onKill,
		Topology: topology.Config{Delay: env.Delay(topology.Delay{})},
	}, env.Logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(*message.Message) error { return nil }))
	go func() { _ = r.Run(context.Background()) }()
	select {
	case <-r.Running(): // the handler consumes and listens to its kill topic
	case <-time.After(testenv.Patience()):
		t.Fatal("the router is not running")
	}
}

// waitFor is --wait for the commands that wait for as many consumers as the queue has: an
// upper bound, never reached when they answer.
const waitFor = "20s"

// warren kill, resume and kill --delete reach a running consumer, which confirms each.
func TestKillResumeDelete(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("cli")
	var (
		mu     sync.Mutex
		states []string
	)
	startRouter(t, env, queue, "", func(e router.KillEvent) { mu.Lock(); states = append(states, e.State); mu.Unlock() })
	await := func(state string) {
		t.Helper()
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(states) > 0 && states[len(states)-1] == state
		}, testenv.Patience(), 10*time.Millisecond, "no %s event", state)
	}

	assert.Regexp(t, `^stop confirmed by 1 consumer in 1 process within \d+(\.\d+)?m?s \(the queue had 1 consumer\)\n$`,
		run(t, env.URL, "kill", queue, "--wait", waitFor))
	await("stopped")
	// Resume returns once the stopped consumer has answered, long before --wait or the
	// context (which ends the wait as an interrupt does) is over.
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience())
	defer cancel()
	assert.Regexp(t, `^resume confirmed by 1 consumer in 1 process within .+ \(1 consumer listening, 0 on the queue: `+
		`stopped ones have none there\)\n$`, runContext(ctx, t, env.URL, "resume", queue, "--wait", "1h"))
	assert.NoError(t, ctx.Err(), "resume waited until the context ended")
	await("resumed")
	// The resumed consumer is back on the queue a moment after its event.
	ch := env.Channel()
	require.Eventually(t, func() bool {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err == nil && q.Consumers == 1
	}, testenv.Patience(), 10*time.Millisecond, "the resumed consumer is not on the queue")
	assert.Regexp(t, `^delete confirmed by 1 consumer in 1 process within .+ \(the queue had 1 consumer\); they drain the queue, then delete it\n$`,
		run(t, env.URL, "kill", queue, "--delete", "--wait", waitFor))
	await("deleted")
	_, err := env.Channel().QueueDeclarePassive(queue, true, false, false, false, nil)
	assert.ErrorContains(t, err, "NOT_FOUND")
}

func TestKillNeedsAQueue(t *testing.T) {
	root := newRoot()
	root.SetArgs([]string{"kill"})
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&bytes.Buffer{})
	err := root.Execute()
	assert.ErrorContains(t, err, "accepts 1 arg")
	assert.Equal(t, 1, exitCode(err))
}

// A kill nobody hears is a warning (exit 0), not "sent": it is remembered for consumers that
// start later.
func TestKillWithoutConsumerWarns(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("nobody")
	_, err := env.Channel().QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	assert.Equal(t, "warning: no consumer of "+queue+" is listening; stop is remembered for consumers that start later\n",
		run(t, env.URL, "kill", queue))
	assert.Equal(t, "warning: no consumer of "+queue+" is listening; resume is remembered for consumers that start later\n",
		run(t, env.URL, "resume", queue))
}

// warren kill and resume of a queue that does not exist exit 2 and declare
// nothing; with --force the command is sent (nobody listens: a warning, exit 0) and
// remembered.
func TestKillOfAMissingQueueExits2(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("nosuchqueue")
	for _, args := range [][]string{{"kill", queue}, {"kill", queue, "--delete"}, {"resume", queue}, {"kill", queue, "--wait", "0"}} {
		stdout, stderr, code := runCode(t, env.URL, args...)
		assert.Equal(t, 2, code, "%v", args)
		assert.Empty(t, stdout, "%v", args)
		assert.Contains(t, stderr, "queue "+queue+" does not exist; nothing was declared or sent (--force sends", "%v", args)
	}
	stdout, _, code := runCode(t, env.URL, "kill", queue, "--json")
	assert.Equal(t, 2, code)
	var res struct {
		QueueExists bool   `json:"queue_exists"`
		Error       string `json:"error"`
		ExitCode    int    `json:"exit_code"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &res), stdout)
	assert.False(t, res.QueueExists)
	assert.Equal(t, 2, res.ExitCode)
	assert.Contains(t, res.Error, "does not exist")
	killExchange := func() error { // on a channel of its own: a passive declare that fails closes it
		return env.Channel().ExchangeDeclarePassive(topology.KillExchange(queue), "fanout", true, false, false, false, nil)
	}
	assert.ErrorContains(t, killExchange(), "NOT_FOUND", "a kill exchange was declared for a queue that does not exist")

	stdout, _, code = runCode(t, env.URL, "kill", queue, "--force")
	assert.Equal(t, 0, code)
	assert.Equal(t, "warning: queue "+queue+" does not exist and no consumer is listening; stop is remembered for consumers that start later\n", stdout)
	assert.NoError(t, killExchange(), "sent with --force")
}

// Two routers (each with a connection of its own) confirm a kill: 2 consumers in 1
// process (this one), as many as the queue had; --json prints the same as JSON.
func TestKillConfirmedByTwoRouters(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("two")
	startRouter(t, env, queue, "", nil)
	startRouter(t, env, queue, "", nil)

	stdout, stderr, code := runCode(t, env.URL, "kill", queue, "--wait", waitFor)
	assert.Equal(t, 0, code, stderr)
	assert.Regexp(t, `^stop confirmed by 2 consumers in 1 process within .+ \(the queue had 2 consumers\)\n$`, stdout)

	stdout, stderr, code = runCode(t, env.URL, "resume", queue, "--wait", waitFor, "--json")
	assert.Equal(t, 0, code, stderr)
	var res struct {
		Queue          string         `json:"queue"`
		Action         string         `json:"action"`
		QueueConsumers int            `json:"queue_consumers"`
		Listeners      int            `json:"listeners"`
		Consumers      int            `json:"consumers"`
		Processes      int            `json:"processes"`
		States         map[string]int `json:"states"`
		Answers        []struct {
			Handler string `json:"handler"`
			PID     int    `json:"pid"`
		} `json:"answers"`
		Confirmed bool     `json:"confirmed"`
		Report    []string `json:"report"`
		ExitCode  int      `json:"exit_code"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &res), stdout)
	assert.Equal(t, queue, res.Queue)
	assert.Equal(t, "resume", res.Action)
	assert.Zero(t, res.QueueConsumers, "stopped consumers have no consumer on the queue")
	assert.Equal(t, 2, res.Listeners)
	assert.Equal(t, 2, res.Consumers)
	assert.Equal(t, 1, res.Processes)
	assert.Equal(t, map[string]int{"resumed": 2}, res.States)
	assert.Len(t, res.Answers, 2)
	assert.True(t, res.Confirmed)
	assert.Zero(t, res.ExitCode)
	require.Len(t, res.Report, 1)
	assert.Regexp(t, `^resume confirmed by 2 consumers in 1 process`, res.Report[0])
}

// Exit 3 when not every consumer confirmed: one refused the command (it requires
// a secret the CLI does not have), or the queue has a consumer that is not warren's (it does
// not answer, and does not stop).
func TestKillNotConfirmedByEveryConsumerExits3(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("unconfirmed")
	env.Remove([]string{kill.StateQueue(queue, []byte("s3cret"))}, nil)
	startRouter(t, env, queue, "s3cret", nil)
	stdout, stderr, code := runCode(t, env.URL, "kill", queue, "--wait", waitFor)
	assert.Equal(t, 3, code)
	assert.Equal(t, "warning: 1 consumer refused stop: unsigned command (is $WARREN_KILL_SECRET theirs?)\n", stdout)
	assert.Contains(t, stderr, "stop "+queue+": not confirmed by every consumer")

	other := env.Queue("foreign")
	startRouter(t, env, other, "", nil)
	_, err := env.Channel().Consume(other, "", false, false, false, false, nil) // not warren's
	require.NoError(t, err)
	stdout, _, code = runCode(t, env.URL, "kill", other, "--wait", "2s")
	assert.Equal(t, 3, code)
	assert.Regexp(t, regexp.QuoteMeta("warning: stop confirmed by 1 consumer in 1 process within ")+`.+`+
		regexp.QuoteMeta(" (the queue had 2 consumers); the others may still be finishing their messages")+`.*\n$`, stdout)
}

// cliDelay returns delay levels of the test's own that the flags --prefix and --levels name
// (the default radix): 4 levels, 60 queues, delays up to 65.5 s.
func cliDelay(env *testenv.Env) topology.Delay { return env.Delay(topology.Delay{Levels: 4}) }
