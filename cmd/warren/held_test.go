package main

import (
	"context"
	"errors"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// `held list` shows a key held after its message was poisoned, and `held release --all` has
// its held messages handled.
func TestHeldListAndRelease(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.Queue("held")
	const lanes, key = 2, "order-7"
	var names []string
	for i := range lanes {
		names = append(names, topology.LaneQueue(q, i), topology.HeldQueue(q, i))
	}
	env.Remove(append(names, topology.HeldState(q)), nil)
	r, err := router.New(router.Config{
		Connection: env.Connection(), Topology: topology.Config{Delay: env.Delay(topology.Delay{})},
		Declare: topology.Topology{Queues: []topology.Queue{{Name: q, Lanes: lanes}}},
		Retry:   middleware.BackoffConfig{MaxAttempts: 1},
	}, env.Logger())
	require.NoError(t, err)
	var (
		mu      sync.Mutex
		handled []string
	)
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: q, Lanes: lanes}, func(msg *message.Message) error {
		if msg.UUID == "m0" {
			return warren.Permanent(errors.New("card declined"))
		}
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, msg.UUID)
		return nil
	}))
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() { _ = r.Close(); assert.NoError(t, <-done) })
	<-r.Running()
	var msgs []*message.Message
	for _, id := range []string{"m0", "m1", "m2"} {
		m := message.NewMessage(id, nil)
		warren.OrderBy(m, key)
		msgs = append(msgs, m)
	}
	require.NoError(t, r.Publisher().Publish(q, msgs...))
	var out string
	require.Eventually(t, func() bool {
		out = run(t, env.URL, "held", "list", q)
		return regexp.MustCompile(`"order-7"\s+\S+\.lane\.\d\s+2\s+.*m0\s+permanent: card declined\s+-`).MatchString(out)
	}, testenv.Patience(), 100*time.Millisecond, "held list")
	assert.Contains(t, out, "1 key held")
	assert.Contains(t, run(t, env.URL, "status", q), "1 held key (warren held list "+q+")")
	assert.Contains(t, run(t, env.URL, "held", "release", q, "--all"), `release: "order-7"`)
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(handled) == 2
	}, testenv.Patience(), 50*time.Millisecond)
	mu.Lock()
	assert.Equal(t, []string{"m1", "m2"}, handled)
	mu.Unlock()
	require.Eventually(t, func() bool {
		return regexp.MustCompile(`(?m)^0 keys held`).MatchString(run(t, env.URL, "held", "list", q))
	},
		testenv.Patience(), 100*time.Millisecond)
	_, stderr, code := runCode(t, env.URL, "held", "skip", q, "nothing-held")
	assert.NotZero(t, code)
	assert.Contains(t, stderr, "not held")
}
