package scheduler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEveryTicksOnMultiplesSinceTheEpoch(t *testing.T) {
	s, err := parseSpec("@every 10s", time.UTC)
	require.NoError(t, err)
	at := time.Date(2026, 11, 27, 10, 0, 3, 500, time.UTC)
	assert.Equal(t, time.Date(2026, 11, 27, 10, 0, 10, 0, time.UTC), s.Next(at))
	assert.Equal(t, time.Date(2026, 11, 27, 10, 0, 20, 0, time.UTC), s.Next(s.Next(at)), "a tick's next is the one after it")

	// Multiples since 1970, whatever d: 7 s does not divide the seconds from year 1 to 1970.
	seven, err := parseSpec("@every 7s", time.UTC)
	require.NoError(t, err)
	next := seven.Next(at)
	assert.Zero(t, next.Unix()%7, "%s", next)
	assert.True(t, next.After(at) && next.Sub(at) <= 7*time.Second, "%s", next)
	week, err := parseSpec("@every 168h", time.UTC)
	require.NoError(t, err)
	assert.Equal(t, time.Thursday, week.Next(at).Weekday(), "1970-01-01 was a Thursday")

	for _, bad := range []string{"@every 1.5s", "@every 500ms", "@every soon", "*/5 * *", "@fortnightly",
		"CRON_TZ=Europe/Paris @every 10s", "TZ=UTC @every 1m"} {
		_, err := parseSpec(bad, time.UTC)
		assert.ErrorContains(t, err, bad)
	}
}

// A cron expression is read on the clock of the location, unless it names its own.
func TestCronInATimeZone(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	require.NoError(t, err)
	s, err := parseSpec("30 9 * * *", paris)
	require.NoError(t, err)
	at := time.Date(2026, 11, 27, 0, 0, 0, 0, time.UTC)
	assert.Equal(t, time.Date(2026, 11, 27, 8, 30, 0, 0, time.UTC), s.Next(at).UTC(), "9:30 in Paris is 8:30 UTC in winter")

	own, err := parseSpec("CRON_TZ=America/New_York 30 9 * * *", paris)
	require.NoError(t, err)
	assert.Equal(t, time.Date(2026, 11, 27, 14, 30, 0, 0, time.UTC), own.Next(at).UTC())
}

func TestBetweenKeepsTheLatest(t *testing.T) {
	s, err := parseSpec("@every 1m", time.UTC)
	require.NoError(t, err)
	after := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ticks, more := between(s, after, after.Add(10*time.Minute), 3)
	assert.Equal(t, []time.Time{after.Add(8 * time.Minute), after.Add(9 * time.Minute), after.Add(10 * time.Minute)}, ticks)
	assert.Equal(t, 7, more)

	ticks, more = between(s, after, after.Add(59*time.Second), 3)
	assert.Empty(t, ticks, "after itself is not a tick after it")
	assert.Zero(t, more)

	// A state from long ago (or forged) is counted, not stepped through tick by tick.
	ticks, more = between(s, time.Time{}.Add(time.Second), after, 2)
	assert.Equal(t, []time.Time{after.Add(-time.Minute), after}, ticks)
	assert.Greater(t, more, 1_000_000_000)
	cron, err := parseSpec("* * * * *", time.UTC)
	require.NoError(t, err)
	ticks, more = between(cron, time.Time{}.Add(time.Second), after, 2)
	assert.Equal(t, []time.Time{after.Add(-time.Minute), after}, ticks)
	assert.Equal(t, 366*24*60-2, more, "a cron expression's ticks within a year before")

	// The same ticks as stepping through them.
	for _, n := range []int{1, 3, 10} {
		stepped := []time.Time{}
		for tk := s.Next(after); !tk.After(after.Add(10 * time.Minute)); tk = s.Next(tk) {
			stepped = append(stepped, tk)
		}
		ticks, more := between(s, after, after.Add(10*time.Minute), n)
		assert.Equal(t, stepped[len(stepped)-n:], ticks)
		assert.Equal(t, len(stepped)-n, more)
	}
}
