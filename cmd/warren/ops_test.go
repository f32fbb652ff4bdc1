package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// cli runs warren with args and returns its output and error.
func cliErr(url string, args ...string) (string, error) {
	root := newRoot()
	var out syncBuffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetIn(strings.NewReader(""))
	root.SetArgs(cliArgs(url, args...))
	err := root.Execute()
	return out.String(), err
}

// An operator's round: a router poisons 8 of 12 orders for two reasons; the operator lists
// and groups the failures, replays the group whose cause was fixed, exports and purges the
// rest, and status shows each step.
func TestPoisonCommands(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	delay := cliDelay(env)
	q := env.Queue("orders")
	var (
		mu      sync.Mutex
		fixed   bool
		handled []string
	)
	r, err := router.New(router.Config{
		Connection: env.Connection(),
		Topology:   topology.Config{Delay: delay},
		Retry:      middleware.BackoffConfig{Delays: []time.Duration{time.Millisecond}},
	}, env.Logger())
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Name: "charge", Queue: q}, func(m *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		n := string(m.Payload)
		switch {
		case strings.HasSuffix(n, "0") || strings.HasSuffix(n, "4") || strings.HasSuffix(n, "8"):
			if !fixed {
				return fmt.Errorf("order %s: card service unavailable", n)
			}
		case strings.HasSuffix(n, "1") || strings.HasSuffix(n, "5") || strings.HasSuffix(n, "9"):
			return warren.Permanent(fmt.Errorf("order %s: no such customer", n))
		}
		handled = append(handled, n)
		return nil
	}))
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	for i := range 12 {
		require.NoError(t, r.Publisher().Publish(q, message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprint(100+i)))))
	}
	require.Eventually(t, func() bool { return env.Messages(topology.PoisonQueue(q)) == 8 }, testenv.Patience(), 10*time.Millisecond)

	delayFlag := []string{"--prefix", delay.Prefix, "--levels", fmt.Sprint(delay.Levels)}
	out := run(t, env.URL, append([]string{"status", q}, delayFlag...)...)
	t.Log("\n" + out)
	assert.Regexp(t, regexp.MustCompile(q+`\s+0\s+1\s+-\s+8\n`), out)
	assert.Contains(t, out, "0 waiting, 0 parked")

	out = run(t, env.URL, "poison", "list", q)
	t.Log("\n" + out)
	assert.Contains(t, out, "8 messages")
	assert.Contains(t, out, "order 100: card service unavailable")
	assert.Contains(t, out, warren.PoisonReasonPermanent)
	assert.Contains(t, out, warren.PoisonReasonExhausted)

	out = run(t, env.URL, "poison", "list", q, "--group")
	t.Log("\n" + out)
	assert.Regexp(t, `\s4\s+charge\s+\*errors.errorString\s+order <n>: card service unavailable`, out)
	assert.Regexp(t, `\s4\s+charge\s+\*errors.errorString\s+permanent: order <n>: no such customer`, out)
	var groups []ops.FailureGroup
	require.NoError(t, json.Unmarshal([]byte(run(t, env.URL, "poison", "list", q, "--group", "--json")), &groups))
	require.Len(t, groups, 2)
	unavailable := groups[0]
	if unavailable.Error != "order <n>: card service unavailable" {
		unavailable = groups[1]
	}
	require.Equal(t, "order <n>: card service unavailable", unavailable.Error)

	mu.Lock()
	fixed = true
	mu.Unlock()
	out = run(t, env.URL, "poison", "replay", q, "--group-id", unavailable.ID)
	t.Log("\n" + out)
	assert.Contains(t, out, "replayed 4 messages of the poison queue "+topology.PoisonQueue(q)+" to where they were going (scanned 8)")
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) == 4+4 }, testenv.Patience(), 10*time.Millisecond)
	assert.Equal(t, 4, env.Messages(topology.PoisonQueue(q)))

	out = run(t, env.URL, "poison", "export", q)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4)
	var m ops.Message
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &m))
	assert.Equal(t, "101", string(m.Body))
	assert.Equal(t, warren.PoisonReasonPermanent, m.Reason)

	_, err = cliErr(env.URL, "poison", "purge", q)
	assert.ErrorContains(t, err, "holds 4 messages: purge them with --yes")
	assert.Equal(t, 4, env.Messages(topology.PoisonQueue(q)))
	assert.Contains(t, run(t, env.URL, "poison", "purge", q, "--yes"), "deleted 4 messages")
	assert.Equal(t, 0, env.Messages(topology.PoisonQueue(q)))

	assert.Contains(t, run(t, env.URL, append([]string{"parked", "list"}, delayFlag...)...), "0 messages")

	_, err = cliErr(env.URL, "poison", "list", env.Name("nothing"))
	assert.ErrorIs(t, err, ops.ErrNoQueue)
}
