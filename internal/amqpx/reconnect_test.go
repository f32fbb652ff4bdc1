package amqpx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/amqpx"
)

// Reconnect runs the session again after each failure, telling failed the wait, which grows
// up to Max and starts over after a session that called steady; it ends when the session
// returns nil, when failed returns an error (that error), or when ctx ends (nil).
func TestReconnectBacksOffAndEnds(t *testing.T) {
	b := amqpx.Backoff{Initial: time.Millisecond, Max: 8 * time.Millisecond}
	lost := errors.New("lost")

	var waits []time.Duration
	sessions := 0
	err := amqpx.Reconnect(t.Context(), b, func(ctx context.Context, steady func()) error {
		sessions++
		if sessions == 6 {
			steady()
		}
		if sessions == 8 {
			return nil
		}
		return lost
	}, func(err error, wait time.Duration) error {
		assert.Equal(t, lost, err)
		waits = append(waits, wait)
		return nil
	})
	require.NoError(t, err)
	require.Len(t, waits, 7)
	for i, w := range waits {
		assert.LessOrEqual(t, w, b.Max*3/2, "wait %d: %s", i, w)
	}
	assert.Greater(t, waits[4], 2*time.Millisecond, "grown after 5 failures: %v", waits)
	assert.LessOrEqual(t, waits[5], b.Initial*3/2, "started over after a steady session: %v", waits)

	stop := errors.New("cannot be cured")
	err = amqpx.Reconnect(t.Context(), b, func(context.Context, func()) error { return lost },
		func(error, time.Duration) error { return stop })
	assert.Equal(t, stop, err)

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	assert.NoError(t, amqpx.Reconnect(ctx, b, func(context.Context, func()) error { return lost }, nil))
}
