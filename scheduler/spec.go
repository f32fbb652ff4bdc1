package scheduler

import (
	"fmt"
	"strings"
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
	d := time.Duration(e)
	return t.Truncate(d).Add(d)
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
	sched, err := cron.ParseStandard(s)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", s, err)
	}
	return inLocation{sched, loc}, nil
}

// inLocation reads a cron schedule on the clock of loc (unless it names its own zone).
type inLocation struct {
	cron.Schedule
	loc *time.Location
}

func (l inLocation) Next(t time.Time) time.Time { return l.Schedule.Next(t.In(l.loc)) }

// between returns the ticks of s in (after, until], at most limit of them (the latest ones),
// and how many more there were.
func between(s spec, after, until time.Time, limit int) (ticks []time.Time, more int) {
	for t := s.Next(after); !t.IsZero() && !t.After(until); t = s.Next(t) {
		ticks = append(ticks, t)
		if len(ticks) > limit {
			ticks = ticks[1:]
			more++
		}
	}
	return ticks, more
}
