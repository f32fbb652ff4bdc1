package ui

import (
	"fmt"
	"strconv"
	"time"
)

// human writes d as a reader takes it in at a glance, in its two largest units: "250 ms",
// "1.5 s", "3 min 20 s", "5 h 2 min", "3 d 16 h", and past ten days "49 days". The
// smaller unit is rounded.
func human(d time.Duration) string {
	if d < 0 {
		return "-" + human(-d)
	}
	const day = 24 * time.Hour
	// two writes d in units big and small, unless rounding it to small reaches limit, where
	// the next larger units take over.
	two := func(big, small, limit time.Duration, bigName, smallName string) string {
		r := d.Round(small)
		if r >= limit {
			return human(r)
		}
		n, rest := r/big, (r%big)/small
		if rest == 0 {
			return fmt.Sprintf("%d %s", n, bigName)
		}
		return fmt.Sprintf("%d %s %d %s", n, bigName, rest, smallName)
	}
	switch {
	case d < time.Second:
		if r := d.Round(time.Millisecond); r < time.Second {
			return fmt.Sprintf("%d ms", r/time.Millisecond)
		}
		return "1 s"
	case d < time.Minute:
		if r := d.Round(time.Millisecond); r < time.Minute {
			return strconv.FormatFloat(r.Seconds(), 'f', -1, 64) + " s"
		}
		return "1 min"
	case d < time.Hour:
		return two(time.Minute, time.Second, time.Hour, "min", "s")
	case d < day:
		return two(time.Hour, time.Minute, day, "h", "min")
	case d < 10*day:
		return two(day, time.Hour, 10*day, "d", "h")
	}
	return fmt.Sprintf("%d days", d.Round(day)/day)
}

// ago says how long before now t was ("3 min 20 s ago"; "in 2 h" for a time ahead), "-"
// for the zero time; to the second.
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	if d < 0 {
		return "in " + human((-d).Round(time.Second))
	}
	if d < time.Second {
		return "just now"
	}
	return human(d.Round(time.Second)) + " ago"
}

// count writes n with its thousands separated: 20,000.
func count(n int) string {
	if n < 0 {
		return "-" + count(-n)
	}
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// short writes n in at most four characters where it is large: 950, 1.2k, 20k, 3.4M.
func short(n float64) string {
	switch {
	case n >= 1e6:
		return strconv.FormatFloat(roundTo(n/1e6), 'f', -1, 64) + "M"
	case n >= 1e3:
		return strconv.FormatFloat(roundTo(n/1e3), 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(roundTo(n), 'f', -1, 64)
}

// roundTo rounds x to one decimal below 10, to a whole number above.
func roundTo(x float64) float64 {
	if x < 10 {
		return float64(int(x*10+0.5)) / 10
	}
	return float64(int(x + 0.5))
}
