package router_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

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

// A key whose message is poisoned is held: its later messages wait, parked on the broker,
// while other keys go on; released, they are handled in their order, and what the key gets
// afterwards too. A key skipped has its held messages poisoned, with the reason, and goes on.
func TestPoisonHoldsItsKeyUntilReleasedOrSkipped(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("held")
	const lanes = 2
	r := orderedRouter(t, env, q, lanes, middleware.BackoffConfig{MaxAttempts: 1})
	released, skipped := "released", "skipped"
	var (
		mu      sync.Mutex
		handled = map[string][]string{}
		changed = make(chan struct{}, 1)
	)
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: q, Lanes: lanes}, func(msg *message.Message) error {
		if msg.UUID == released+"/0" || msg.UUID == skipped+"/0" {
			return warren.Permanent(errors.New("a bug"))
		}
		mu.Lock()
		handled[warren.OrderKey(msg)] = append(handled[warren.OrderKey(msg)], msg.UUID)
		mu.Unlock()
		select {
		case changed <- struct{}{}:
		default:
		}
		return nil
	}))
	start(t, r)
	o, err := ops.New(ops.Config{Connection: env.Connection()}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = o.Close() })
	ctx := context.Background()

	var msgs []*message.Message
	for i := range 4 {
		msgs = append(msgs, keyed(released, i), keyed(skipped, i), keyed("free", i))
	}
	require.NoError(t, r.Publisher().Publish(q, msgs...))
	waitFor(t, changed, &mu, func() bool { return len(handled["free"]) == 4 }, handled)
	var keys []ops.HeldKey
	require.Eventually(t, func() bool {
		keys, err = o.Held(ctx, q)
		require.NoError(t, err)
		return len(keys) == 2 && keys[0].Messages == 3 && keys[1].Messages == 3
	}, testenv.Patience(), 50*time.Millisecond, "two keys held, three messages each")
	slices.SortFunc(keys, func(a, b ops.HeldKey) int { return strings.Compare(a.Key, b.Key) })
	assert.Equal(t, released+"/0", keys[0].MessageID)
	assert.Contains(t, keys[0].Error, "a bug")
	assert.Equal(t, topology.LaneQueue(q, topology.Lane(released, lanes)), keys[0].Lane)
	mu.Lock()
	assert.Empty(t, handled[released], "a held key's messages wait")
	assert.Empty(t, handled[skipped], "a held key's messages wait")
	mu.Unlock()
	require.Equal(t, 2, env.Messages(topology.PoisonQueue(q)), "the messages that held the keys are poisoned")
	require.ErrorIs(t, o.ReleaseKey(ctx, q, "free"), ops.ErrNotHeld)

	require.NoError(t, r.Publisher().Publish(q, keyed(released, 4)))
	require.NoError(t, o.ReleaseKey(ctx, q, released))
	waitFor(t, changed, &mu, func() bool { return len(handled[released]) == 4 }, handled)
	mu.Lock()
	assert.Equal(t, []string{released + "/1", released + "/2", released + "/3", released + "/4"}, handled[released],
		"released: the held messages in their order, then the one that came meanwhile")
	mu.Unlock()

	require.NoError(t, o.SkipKey(ctx, q, skipped))
	require.Eventually(t, func() bool { return env.Messages(topology.PoisonQueue(q)) == 5 }, testenv.Patience(), 50*time.Millisecond)
	poisoned, err := o.Poisoned(ctx, q, ops.Browse{})
	require.NoError(t, err)
	var skippedIDs []string
	for _, m := range poisoned {
		if m.Reason == warren.PoisonReasonSkipped {
			skippedIDs = append(skippedIDs, m.ID)
		}
	}
	assert.Equal(t, []string{skipped + "/1", skipped + "/2", skipped + "/3"}, skippedIDs)
	require.NoError(t, r.Publisher().Publish(q, keyed(skipped, 4)))
	waitFor(t, changed, &mu, func() bool { return len(handled[skipped]) == 1 }, handled)
	require.Eventually(t, func() bool {
		keys, err = o.Held(ctx, q)
		require.NoError(t, err)
		return len(keys) == 0
	}, testenv.Patience(), 50*time.Millisecond, "held keys remain")
	for i := range lanes {
		assert.Zero(t, env.Messages(topology.HeldQueue(q, i)), "nothing left held")
	}
}

// waitFor waits until cond holds under mu, woken by changed, for up to testenv.Patience.
func waitFor(t *testing.T, changed <-chan struct{}, mu *sync.Mutex, cond func() bool, what any) {
	t.Helper()
	deadline := time.After(testenv.Patience())
	for {
		mu.Lock()
		ok := cond()
		mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("waited in vain; so far: %v", fmt.Sprint(what))
		}
	}
}

// A held key stays held across processes: the next process to consume its lane reads the
// hold from the broker and parks the key's messages, and carries out a release.
func TestAHeldKeyStaysHeldInTheNextProcess(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("held")
	const lanes = 2
	key := "k"
	var (
		mu      sync.Mutex
		handled []string
		changed = make(chan struct{}, 1)
	)
	handler := func(msg *message.Message) error {
		if msg.UUID == key+"/0" {
			return warren.Permanent(errors.New("a bug"))
		}
		mu.Lock()
		handled = append(handled, msg.UUID)
		mu.Unlock()
		select {
		case changed <- struct{}{}:
		default:
		}
		return nil
	}
	first := orderedRouter(t, env, q, lanes, middleware.BackoffConfig{MaxAttempts: 1})
	require.NoError(t, first.AddConsumerHandler(router.HandlerConfig{Queue: q, Lanes: lanes}, handler))
	start(t, first)
	o, err := ops.New(ops.Config{Connection: env.Connection()}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = o.Close() })
	ctx := context.Background()
	require.NoError(t, first.Publisher().Publish(q, keyed(key, 0), keyed(key, 1)))
	require.Eventually(t, func() bool {
		keys, err := o.Held(ctx, q)
		require.NoError(t, err)
		return len(keys) == 1 && keys[0].Messages == 1
	}, testenv.Patience(), 50*time.Millisecond, "the key held, its second message parked")
	require.NoError(t, first.Close())

	second := orderedRouter(t, env, q, lanes, middleware.BackoffConfig{MaxAttempts: 1})
	require.NoError(t, second.AddConsumerHandler(router.HandlerConfig{Queue: q, Lanes: lanes}, handler))
	start(t, second)
	require.NoError(t, second.Publisher().Publish(q, keyed(key, 2)))
	require.Eventually(t, func() bool {
		keys, err := o.Held(ctx, q)
		require.NoError(t, err)
		return len(keys) == 1 && keys[0].Messages == 2
	}, testenv.Patience(), 50*time.Millisecond, "the next process parks the key's message")
	mu.Lock()
	assert.Empty(t, handled)
	mu.Unlock()
	require.NoError(t, o.ReleaseKey(ctx, q, key))
	waitFor(t, changed, &mu, func() bool { return len(handled) == 2 }, &handled)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{key + "/1", key + "/2"}, handled)
}

// A handler that goes on after poison holds nothing: the key's next message is handled.
func TestGoOnAfterPoisonHoldsNothing(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("goon")
	r := orderedRouter(t, env, q, 2, middleware.BackoffConfig{MaxAttempts: 1})
	next := make(chan string, 1)
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: q, Lanes: 2, GoOnAfterPoison: true}, func(msg *message.Message) error {
		if msg.UUID == "k/0" {
			return warren.Permanent(errors.New("a bug"))
		}
		next <- msg.UUID
		return nil
	}))
	start(t, r)
	require.NoError(t, r.Publisher().Publish(q, keyed("k", 0), keyed("k", 1)))
	select {
	case id := <-next:
		assert.Equal(t, "k/1", id)
	case <-time.After(testenv.Patience()):
		t.Fatal("the key's next message was not handled")
	}
	assert.Equal(t, 1, env.Messages(topology.PoisonQueue(q)))
}

// A release takes one key's messages out of its lane's held queue and puts the others' back
// in their order: many of them, interleaved (a quorum queue returns 200 messages got one by
// one out of order: docs/decisions.md).
func TestAReleaseKeepsTheOtherHeldKeysInOrder(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("held")
	r := orderedRouter(t, env, q, 1, middleware.BackoffConfig{MaxAttempts: 1})
	const each = 60
	var (
		mu      sync.Mutex
		handled = map[string][]string{}
		changed = make(chan struct{}, 1)
	)
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: q, Lanes: 1}, func(msg *message.Message) error {
		if msg.UUID == "a/0" || msg.UUID == "b/0" {
			return warren.Permanent(errors.New("a bug"))
		}
		mu.Lock()
		handled[warren.OrderKey(msg)] = append(handled[warren.OrderKey(msg)], msg.UUID)
		mu.Unlock()
		select {
		case changed <- struct{}{}:
		default:
		}
		return nil
	}))
	start(t, r)
	o, err := ops.New(ops.Config{Connection: env.Connection()}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = o.Close() })
	ctx := context.Background()
	require.NoError(t, r.Publisher().Publish(q, keyed("a", 0), keyed("b", 0)))
	require.Eventually(t, func() bool {
		keys, err := o.Held(ctx, q)
		require.NoError(t, err)
		return len(keys) == 2
	}, testenv.Patience(), 20*time.Millisecond, "both keys held")
	var msgs []*message.Message
	for i := 1; i <= each; i++ {
		msgs = append(msgs, keyed("a", i), keyed("b", i))
	}
	require.NoError(t, r.Publisher().Publish(q, msgs...))
	require.Eventually(t, func() bool { return env.Messages(topology.HeldQueue(q, 0)) == 2*each },
		testenv.Patience(), 50*time.Millisecond, "every later message parked")

	want := func(key string) []string {
		var ids []string
		for i := 1; i <= each; i++ {
			ids = append(ids, fmt.Sprintf("%s/%d", key, i))
		}
		return ids
	}
	require.NoError(t, o.ReleaseKey(ctx, q, "a"))
	waitFor(t, changed, &mu, func() bool { return len(handled["a"]) == each }, handled)
	require.Eventually(t, func() bool { return env.Messages(topology.HeldQueue(q, 0)) == each },
		testenv.Patience(), 50*time.Millisecond, "b's messages back in the held queue")
	require.NoError(t, o.ReleaseKey(ctx, q, "b"))
	waitFor(t, changed, &mu, func() bool { return len(handled["b"]) == each }, handled)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, want("a"), handled["a"])
	assert.Equal(t, want("b"), handled["b"], "the key left held kept its order")
}
