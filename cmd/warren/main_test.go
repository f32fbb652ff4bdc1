package main

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

func run(t *testing.T, url string, args ...string) string {
	t.Helper()
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"--url", url}, args...))
	require.NoError(t, root.Execute(), out.String())
	return out.String()
}

// warren kill, resume and kill --delete reach a running consumer.
func TestKillResumeDelete(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("cli")
	var (
		mu     sync.Mutex
		states []string
	)
	r, err := router.New(router.Config{
		Connection: env.Connection(),
		Subscriber: router.SubscriberConfig{OnKill: func(e router.KillEvent) { mu.Lock(); states = append(states, e.State); mu.Unlock() }},
		Topology:   topology.Config{Delay: env.Delay(topology.Delay{})},
	}, env.Logger())
	require.NoError(t, err)
	defer r.Close()
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(*message.Message) error { return nil }))
	go func() { _ = r.Run(context.Background()) }()
	select {
	case <-r.Running(): // the handler consumes and listens to its kill topic
	case <-time.After(30 * time.Second):
		t.Fatal("the router is not running")
	}
	await := func(state string) {
		t.Helper()
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(states) > 0 && states[len(states)-1] == state
		}, 10*time.Second, 10*time.Millisecond, "no %s event", state)
	}

	assert.Equal(t, "sent stop to every consumer of "+queue+"\n", run(t, env.URL, "kill", queue))
	await("stopped")
	assert.Contains(t, run(t, env.URL, "resume", queue), "sent resume")
	await("resumed")
	assert.Contains(t, run(t, env.URL, "kill", queue, "--delete"), "sent delete")
	await("deleted")
	_, err = env.Channel().QueueDeclarePassive(queue, true, false, false, false, nil)
	assert.ErrorContains(t, err, "NOT_FOUND")
}

func TestKillNeedsAQueue(t *testing.T) {
	root := newRoot()
	root.SetArgs([]string{"kill"})
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&bytes.Buffer{})
	assert.ErrorContains(t, root.Execute(), "accepts 1 arg")
}

// A kill nobody hears is a warning (exit 0), not "sent": it is remembered for consumers that
// start later.
func TestKillWithoutConsumerWarns(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("nobody")
	assert.Equal(t, "warning: no consumer of "+queue+" is listening; stop is remembered for consumers that start later\n",
		run(t, env.URL, "kill", queue))
	assert.Equal(t, "warning: no consumer of "+queue+" is listening; resume is remembered for consumers that start later\n",
		run(t, env.URL, "resume", queue))
}
