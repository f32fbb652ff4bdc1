package ui

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestHuman(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                      "0 ms",
		250 * time.Millisecond: "250 ms",
		999*time.Millisecond + 700*time.Microsecond:             "1 s",
		1500 * time.Millisecond:                                 "1.5 s",
		12 * time.Second:                                        "12 s",
		59*time.Second + 999900*time.Microsecond:                "1 min",
		3*time.Minute + 20*time.Second:                          "3 min 20 s",
		52*time.Minute + 25728*time.Millisecond:                 "52 min 26 s",
		59*time.Minute + 59700*time.Millisecond:                 "1 h",
		time.Hour:                                               "1 h",
		5*time.Hour + 2*time.Minute:                             "5 h 2 min",
		88*time.Hour + 10*time.Minute:                           "3 d 16 h",
		1193*time.Hour + 2*time.Minute + 47295*time.Millisecond: "50 days",
		88285*time.Hour + 26*time.Minute:                        "3679 days",
		-90 * time.Second:                                       "-1 min 30 s",
	} {
		assert.Equal(t, want, human(d), d.String())
	}
	now := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	assert.Equal(t, "49 days ago", ago(now.Add(-49*24*time.Hour), now))
	assert.Equal(t, "in 2 h", ago(now.Add(2*time.Hour), now))
	assert.Equal(t, "just now", ago(now.Add(-time.Millisecond), now))
	assert.Equal(t, "-", ago(time.Time{}, now))
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 20000: "20,000", 1234567: "1,234,567", -1500: "-1,500"} {
		assert.Equal(t, want, count(n))
	}
	for n, want := range map[float64]string{0: "0", 950: "950", 1234: "1.2k", 20000: "20k", 3.4e6: "3.4M", 0.5: "0.5"} {
		assert.Equal(t, want, short(n))
	}
}
