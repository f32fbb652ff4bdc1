package router

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/warrenmq/warren"
)

// The workers return the chain's error, raise its panic on the caller's goroutine, start no
// more than their limit, and end at stop.
func TestWorkers(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	failed := errors.New("failed")
	var running, most atomic.Int64
	release := make(chan struct{})
	w := newWorkers(3, func(msg *message.Message) ([]*message.Message, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		switch msg.UUID {
		case "fail":
			return nil, failed
		case "panic":
			panic("handler panicked")
		case "wait":
			<-release
		}
		return nil, nil
	})

	assert.NoError(t, w.handle(message.NewMessage("ok", nil)))
	assert.ErrorIs(t, w.handle(message.NewMessage("fail", nil)), failed)
	assert.PanicsWithValue(t, "handler panicked", func() { _ = w.handle(message.NewMessage("panic", nil)) })

	var wg sync.WaitGroup
	for range 3 { // as many as Watermill hands out at once: the limit
		wg.Go(func() { assert.NoError(t, w.handle(message.NewMessage("wait", nil))) })
	}
	require.Eventually(t, func() bool { return running.Load() == 3 }, 30*time.Second, time.Millisecond)
	close(release)
	wg.Wait()
	assert.LessOrEqual(t, w.started, 3, "workers started")
	assert.EqualValues(t, 3, most.Load(), "messages handled at once")

	w.stop(true)
	assert.ErrorIs(t, w.handle(message.NewMessage("late", nil)), warren.ErrClosed)
}
