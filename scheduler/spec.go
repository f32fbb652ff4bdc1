package scheduler

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/robfig/cron/v3"
)

// spec is a parsed Job.Schedule: the ticks of a job.
type spec interface {
	// Next is the first tick after t.
	Next(t time.Time) time.Time
}

// every ticks on the multiples of a duration since the Unix epoch, so that every process
// computes the same ticks (and tick ids) whenever it starts.
type every time.Duration

func (e every) Next(t time.Time) time.Time {
	// In whole seconds (time.Truncate counts from year 1; UnixNano overflows before 1678).
	sec, d := t.Unix(), int64(time.Duration(e)/time.Second)
	q := sec / d
	if sec%d != 0 && sec < 0 {
		q-- // floor
	}
	return time.Unix((q+1)*d, 0).In(t.Location())
}

// parseSpec reads a cron expression (five fields, or @yearly, @monthly, @weekly, @daily,
// @hourly; CRON_TZ=Zone in front sets its own time zone) in loc, or @every D.
func parseSpec(s string, loc *time.Location) (spec, error) {
	if rest, ok := strings.CutPrefix(s, "@every "); ok {
		d, err := time.ParseDuration(strings.TrimSpace(rest))
		if err != nil {
			return nil, fmt.Errorf("%q: %w", s, err)
		}
		if d < time.Second || d%time.Second != 0 {
			return nil, fmt.Errorf("%q: not a whole number of seconds of at least 1s", s)
		}
		return every(d), nil
	}
	if f := strings.Fields(s); len(f) > 1 && strings.HasPrefix(f[1], "@every") &&
		(strings.HasPrefix(f[0], "CRON_TZ=") || strings.HasPrefix(f[0], "TZ=")) {
		return nil, fmt.Errorf("%q: @every takes no time zone", s)
	}
	sched, err := cron.ParseStandard(s)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", s, err)
	}
	return &inLocation{Schedule: sched, loc: loc}, nil
}

// inLocation reads a cron schedule on the clock of loc (unless it names its own zone). It
// remembers its last two answers, each good for every time from the one asked about to the
// tick answered (no tick lies between them): the active scheduler asks for the next tick and
// the one after it at every wake-up, at least hourly, and stepping through a cron expression
// costs far more than the asking.
type inLocation struct {
	cron.Schedule
	loc *time.Location

	mu     sync.Mutex
	recent [2]struct{ after, next time.Time } // the newer first; zero: none
}

func (l *inLocation) Next(t time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recent {
		if !r.after.IsZero() && !t.Before(r.after) && t.Before(r.next) {
			return r.next
		}
	}
	next := l.Schedule.Next(t.In(l.loc))
	l.recent[1] = l.recent[0]
	l.recent[0].after, l.recent[0].next = t, next
	return next
}

// maxMissedSpan bounds how far back between looks for the ticks of a cron expression: a
// state recorded that long ago (or forged) must not keep the scheduler stepping through
// every minute since.
const maxMissedSpan = 366 * 24 * time.Hour

// between returns the ticks of s in (after, until], at most limit of them (the latest ones),
// and how many more there were (of a cron expression, within maxMissedSpan before until).
func between(s spec, after, until time.Time, limit int) (ticks []time.Time, more int) {
	if e, ok := s.(every); ok && until.After(after) { // counted, not stepped through
		d := int64(time.Duration(e) / time.Second)
		first := e.Next(after)
		if first.After(until) {
			return nil, 0
		}
		n := int((until.Unix()-first.Unix())/d) + 1
		k := min(n, limit)
		for i := n - k; i < n; i++ {
			ticks = append(ticks, time.Unix(first.Unix()+int64(i)*d, 0).In(first.Location()))
		}
		return ticks, n - k
	}
	if earliest := until.Add(-maxMissedSpan); after.Before(earliest) {
		after = earliest
	}
	for t := s.Next(after); !t.IsZero() && !t.After(until); t = s.Next(t) {
		ticks = append(ticks, t)
		if len(ticks) > limit {
			ticks = ticks[1:]
			more++
		}
	}
	return ticks, more
}
