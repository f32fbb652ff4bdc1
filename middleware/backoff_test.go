package middleware_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/middleware"
)

func newBackoff(t *testing.T, cfg middleware.BackoffConfig) *middleware.Backoff {
	t.Helper()
	cfg.Publisher = &recordingPublisher{}
	b, err := middleware.NewBackoff(cfg, nil)
	require.NoError(t, err)
	return b
}

// An explicit schedule: Delays[n-1] after attempt n, the last one repeating; an attempt
// below 1 counts as 1.
func TestBackoffDelayExplicitSchedule(t *testing.T) {
	b := newBackoff(t, middleware.BackoffConfig{Delays: []time.Duration{time.Second, 5 * time.Second, 30 * time.Second}})
	assert.Equal(t, 4, b.MaxAttempts(), "len(Delays)+1")
	for attempt, want := range map[int]time.Duration{
		-3: time.Second, 0: time.Second, 1: time.Second, 2: 5 * time.Second,
		3: 30 * time.Second, 4: 30 * time.Second, 100: 30 * time.Second,
	} {
		assert.Equal(t, want, b.Delay(attempt), "attempt %d", attempt)
	}

	one := newBackoff(t, middleware.BackoffConfig{Delays: []time.Duration{0}, MaxAttempts: 3})
	assert.Equal(t, time.Duration(0), one.Delay(1))
	assert.Equal(t, time.Duration(0), one.Delay(2))

	// The explicit schedule wins over the exponential fields.
	both := newBackoff(t, middleware.BackoffConfig{Delays: []time.Duration{7 * time.Second}, Initial: time.Minute, Jitter: 1})
	assert.Equal(t, 7*time.Second, both.Delay(1))
	assert.Equal(t, 7*time.Second, both.Delay(3))
}

// Without Delays: Initial 1s, times 2, capped at 5m, no jitter.
func TestBackoffDelayExponentialDefaults(t *testing.T) {
	b := newBackoff(t, middleware.BackoffConfig{})
	assert.Equal(t, 5, b.MaxAttempts())
	want := []time.Duration{ // after attempt 1, 2, ...
		time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second,
		32 * time.Second, 64 * time.Second, 128 * time.Second, 256 * time.Second,
		5 * time.Minute, 5 * time.Minute,
	}
	for i, w := range want {
		assert.Equal(t, w, b.Delay(i+1), "attempt %d", i+1)
	}
	assert.Equal(t, 5*time.Minute, b.Delay(60), "capped, never Stop")
	assert.Equal(t, time.Second, b.Delay(0))
	assert.Equal(t, time.Second, b.Delay(-1))
}

func TestBackoffDelayExponentialCapped(t *testing.T) {
	b := newBackoff(t, middleware.BackoffConfig{Initial: 100 * time.Millisecond, Multiplier: 3, Max: time.Second})
	for attempt, want := range []time.Duration{100 * time.Millisecond, 300 * time.Millisecond, 900 * time.Millisecond, time.Second, time.Second} {
		assert.Equal(t, want, b.Delay(attempt+1), "attempt %d", attempt+1)
	}
}

// Jitter spreads each wait over wait·(1±Jitter), the capped one included (so a wait can
// exceed Max by Jitter·Max).
func TestBackoffDelayJitterBounds(t *testing.T) {
	b := newBackoff(t, middleware.BackoffConfig{Initial: time.Second, Max: 10 * time.Second, Jitter: 0.5})
	for _, tc := range []struct {
		attempt int
		wait    time.Duration
	}{{1, time.Second}, {3, 4 * time.Second}, {8, 10 * time.Second}} {
		lo, hi := tc.wait/2, tc.wait*3/2
		least, most := hi, lo
		for range 500 {
			d := b.Delay(tc.attempt)
			require.True(t, d >= lo && d <= hi, "attempt %d: %s outside [%s, %s]", tc.attempt, d, lo, hi)
			least, most = min(least, d), max(most, d)
		}
		// Each wait is below 3/4·wait with a chance of 1/4: missing it 500 times is
		// impossible in practice, as is missing the top quarter.
		assert.Less(t, least, tc.wait*3/4, "attempt %d: spread below the wait", tc.attempt)
		assert.Greater(t, most, tc.wait*5/4, "attempt %d: spread above the wait", tc.attempt)
	}
}
