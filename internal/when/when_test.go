package when

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	for s, want := range map[string]time.Time{
		"+3s":                          now.Add(3 * time.Second),
		"+1.5ms":                       now.Add(1500 * time.Microsecond),
		"-2h30m":                       now.Add(-150 * time.Minute),
		"2026-01-03T00:00:00Z":         time.Date(2026, 1, 3, 0, 0, 0, 0, time.UTC),
		"2026-01-03T01:00:00.25+01:00": time.Date(2026, 1, 3, 0, 0, 0, 250e6, time.UTC),
	} {
		got, err := Parse(s, now)
		require.NoError(t, err, s)
		assert.True(t, want.Equal(got), "%s: %s, want %s", s, got, want)
	}
	for s, want := range map[string]string{
		"3s":       `"3s" is neither an RFC 3339 time`,
		"tomorrow": `"tomorrow" is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor +D or -D, a Go duration from now (+3s)`,
		"+3 s":     `"+3 s" is not +D or -D, a Go duration from now`,
		"":         `"" is neither`,
	} {
		_, err := Parse(s, now)
		assert.ErrorContains(t, err, want, s)
	}
}

func TestAgo(t *testing.T) {
	now := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	for s, want := range map[string]time.Time{
		"2h":                   now.Add(-2 * time.Hour),
		"-2h":                  now.Add(-2 * time.Hour),
		"+2h":                  now.Add(2 * time.Hour),
		"2026-01-03T00:00:00Z": time.Date(2026, 1, 3, 0, 0, 0, 0, time.UTC),
	} {
		got, err := Ago(s, now)
		require.NoError(t, err, s)
		assert.True(t, want.Equal(got), "%s: %s, want %s", s, got, want)
	}
	_, err := Ago("yesterday", now)
	assert.ErrorContains(t, err, `"yesterday" is neither`)
}
