package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// Every command against the real broker, in turn, with the exit code the table of the
// package doc gives it: 0 done, 1 an error, 2 not found, 3 done in part. (kill and resume
// exiting 3 are TestKillNotConfirmedByEveryConsumerExits3.)
func TestExitCodes(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	d, x, q := cliDelay(env), env.Exchange("codes"), env.Queue("codes")
	file := writeFile(t, d, x, q, 20)
	levels := []string{"--prefix", d.Prefix, "--levels", fmt.Sprint(d.Levels)}
	noLevels := []string{"--prefix", env.Name("nolevels"), "--levels", fmt.Sprint(d.Levels)}
	nosuch := env.Queue("nosuch")
	poison := topology.PoisonQueue(q)

	// parked puts a message into the parking queue, addressed to queue dest, and returns once
	// the broker confirmed it (a replay that runs next sees it).
	parked := func(dest string) func() {
		return func() {
			ch := env.Channel()
			require.NoError(t, ch.Confirm(false))
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", d.ParkingQueue(), true, false,
				amqp.Publishing{MessageId: "parked-" + dest, Headers: amqp.Table{contract.DestQueueHeader: dest}})
			require.NoError(t, err)
			require.True(t, dc.Wait(), "parked message nacked")
		}
	}
	with := func(args []string, more ...string) []string { return append(append([]string{}, more...), args...) }

	for _, c := range []struct {
		args  []string
		stdin string
		code  int
		setup func()
		check func() // after the command
	}{
		{args: []string{"topology", "verify", file}, code: 1}, // nothing declared yet: a failed check
		{args: []string{"topology", "apply", file}, code: 0},
		{args: []string{"topology", "verify", file}, code: 0},
		{args: []string{"topology", "diagram", file}, code: 0},
		{args: []string{"topology", "apply", file + ".nosuch"}, code: 1},
		{args: with(levels, "delays", "apply"), code: 0},
		{args: with(levels, "delays", "verify"), code: 0},
		{args: with(noLevels, "delays", "verify"), code: 1},

		{args: []string{"publish", q}, stdin: "body", code: 0},
		{args: []string{"publish", nosuch}, code: 2},
		{args: []string{"publish", "order.new", "--exchange", x}, code: 0},
		{args: []string{"publish", "order.new", "--exchange", env.Exchange("nosuch")}, code: 2},
		{args: with(levels, "publish", q, "--delay", "1m"), code: 0}, // waits in the levels
		{args: with(noLevels, "publish", q, "--delay", "1m"), code: 2},
		{args: []string{"publish", q, "--header", "novalue"}, code: 1},

		{args: []string{"status", q}, code: 0},
		{args: []string{"status", nosuch}, code: 2},
		{args: []string{"status", q, nosuch}, code: 2},

		{args: []string{"poison", "list", q}, code: 0, setup: func() {
			poisonQueue(t, env, q, message.NewMessage("p1", nil), message.NewMessage("p2", nil), message.NewMessage("p3", nil))
		}},
		{args: []string{"poison", "list", nosuch}, code: 2},
		{args: []string{"poison", "list", q, "--error", "("}, code: 1},
		{args: []string{"poison", "export", q}, code: 0},
		{args: []string{"poison", "export", nosuch}, code: 2},
		{args: []string{"poison", "replay", q, "--to", poison}, code: 1,
			check: func() { assert.Equal(t, 3, env.Messages(poison), "--to its own poison queue moved messages") }},
		{args: []string{"poison", "replay", q, "--to", d.ParkingQueue()}, code: 1,
			check: func() { assert.Zero(t, env.Messages(d.ParkingQueue()), "--to the parking queue moved messages") }},
		{args: []string{"poison", "replay", q, "--to", nosuch}, code: 2,
			check: func() { assert.Equal(t, 3, env.Messages(poison)) }},
		{args: []string{"poison", "replay", q, "--id", "p1"}, code: 0,
			check: func() { assert.Equal(t, 2, env.Messages(poison)) }},
		{args: []string{"poison", "replay", nosuch}, code: 2},
		{args: []string{"poison", "purge", q}, code: 1, // no terminal to ask on
			check: func() { assert.Equal(t, 2, env.Messages(poison)) }},
		{args: []string{"poison", "purge", q, "--yes"}, code: 0},
		{args: []string{"poison", "purge", nosuch, "--yes"}, code: 2},

		{args: with(levels, "parked", "list"), code: 0, setup: parked(q)},
		{args: with(noLevels, "parked", "list"), code: 2},
		{args: with(levels, "parked", "replay", "--to", poison), code: 1,
			check: func() { assert.Zero(t, env.Messages(poison), "--to a poison queue moved messages") }},
		{args: with(levels, "parked", "replay"), code: 3, setup: parked(nosuch)}, // one replayed, one left
		{args: with(levels, "parked", "replay"), code: 2},                        // the one left: its queue does not exist

		{args: []string{"kill", q, "--wait", "0"}, code: 0}, // nobody listens: a warning
		{args: []string{"resume", q, "--wait", "0"}, code: 0},
		{args: []string{"kill", nosuch}, code: 2},
		{args: []string{"resume", nosuch}, code: 2},

		{args: with(levels, "delays", "remove"), code: 1}, // a message waits in them
		{args: with(levels, "delays", "remove", "--force"), code: 0},
		{args: []string{"nosuchcommand"}, code: 1},
		{args: []string{"kill"}, code: 1},
	} {
		if c.setup != nil {
			c.setup()
		}
		root := newRoot()
		var out strings.Builder
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetIn(strings.NewReader(c.stdin))
		// A generous limit: on a loaded CI broker one quorum declare took over 10 s.
		root.SetArgs(cliArgs(env.URL, c.args...))
		start := time.Now()
		code := exitCode(root.Execute())
		assert.Equal(t, c.code, code, "warren %s:\n%s", strings.Join(c.args, " "), out.String())
		t.Logf("warren %s: exit %d in %s", strings.Join(c.args, " "), code, time.Since(start).Round(time.Millisecond))
		if c.check != nil {
			c.check()
		}
	}
}
