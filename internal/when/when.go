// Package when reads a point in time as the CLI and the demos take it on their command
// lines: an RFC 3339 time, or a Go duration relative to now.
package when

import (
	"fmt"
	"strings"
	"time"
)

// Parse reads s as a point in time: an RFC 3339 time (2026-01-02T15:04:05Z, with fractional
// seconds if wanted), or a Go duration relative to now, "+D" after now and "-D" before it
// (+3s, -2h30m). A bare duration is refused: whether it means before or after now is the
// caller's to say (see Ago).
func Parse(s string, now time.Time) (time.Time, error) {
	if strings.HasPrefix(s, "+") || strings.HasPrefix(s, "-") {
		d, err := time.ParseDuration(s)
		if err != nil {
			return time.Time{}, fmt.Errorf("%q is not +D or -D, a Go duration from now (+3s, -2h30m): %w", s, err)
		}
		return now.Add(d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor +D or -D, a Go duration from now (+3s)", s)
	}
	return t, nil
}

// AgoIfSet is Ago, and the zero time for "" (a bound that is not set).
func AgoIfSet(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	return Ago(s, now)
}

// Ago is Parse, except that a bare duration D is D before now ("2h": two hours ago), for
// flags that select what happened in the past.
func Ago(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil && !strings.HasPrefix(s, "+") && !strings.HasPrefix(s, "-") {
		return now.Add(-d), nil
	}
	return Parse(s, now)
}
