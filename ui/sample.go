package ui

import (
	"context"
	"fmt"
	"html/template"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/warrenmq/warren/ops"
)

// sampler keeps the queues' depths over the last hour, sampled every Config.SampleInterval
// (the overview's own reads are not samples: open pages would shorten the hour kept), and
// the last status read, by the sampler or by an overview.
type sampler struct {
	mu      sync.Mutex
	keep    int // samples kept: an hour's worth
	series  map[string][]point
	sampled time.Time  // the time of the last sample
	last    ops.Status // the last status read without error
	// counts are the poison counts of the work queues (the parking queue's for "") last
	// read while this Handler read none of their messages (see Handler.counted).
	counts map[string]int
}

// point is one sample of a queue: its ready and poison messages at a time.
type point struct {
	at            time.Time
	ready, poison int
}

// delaysSeries is the series of the messages waiting in the delay levels (ready) and
// parked (poison).
const delaysSeries = "\x00delays"

func newSampler(interval time.Duration) *sampler {
	keep := 0
	if interval > 0 {
		keep = int(time.Hour/interval) + 1
	}
	return &sampler{keep: keep, series: map[string][]point{}, counts: map[string]int{}}
}

// substitute sets, in st, the poison count of each queue that reading names (the parking
// queue's for "") to the last count kept of it if that is larger, and keeps the counts of the
// others (and of no queue st does not list). It returns, of those in reading, the queues
// whose count it set.
func (s *sampler) substitute(st *ops.Status, reading map[string]bool) map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	set := map[string]bool{}
	one := func(queue string, n *int) {
		switch kept := s.counts[queue]; {
		case *n < 0: // no such queue
		case !reading[queue]:
			s.counts[queue] = *n
		case kept > *n:
			*n, set[queue] = kept, true
		}
	}
	listed := map[string]bool{"": true}
	for i := range st.Queues {
		one(st.Queues[i].Queue, &st.Queues[i].Poison)
		listed[st.Queues[i].Queue] = true
	}
	one("", &st.Delay.Parked)
	for q := range s.counts { // the queues no longer shown
		if !listed[q] {
			delete(s.counts, q)
		}
	}
	return set
}

// remember keeps st as the last status, unless the one kept is newer (reads that overlap
// end in any order).
func (s *sampler) remember(st ops.Status) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keepLast(st)
}

// keepLast keeps st as the last status unless the one kept is newer. s.mu is held.
func (s *sampler) keepLast(st ops.Status) {
	if st.At.After(s.last.At) {
		s.last = st
	}
}

// record adds the sample st to the series, unless it is not newer than the last sample, and
// keeps it as the last status (see remember). The series of a queue that st does not list
// (gone from the management API's list) or that no longer exists are dropped; a queue that is
// down keeps its series.
func (s *sampler) record(st ops.Status) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keepLast(st)
	if s.keep == 0 || !st.At.After(s.sampled) {
		return
	}
	s.sampled = st.At
	listed := map[string]bool{delaysSeries: true}
	for _, q := range st.Queues {
		listed[q.Queue] = q.Exists
	}
	for name := range s.series {
		if !listed[name] {
			delete(s.series, name)
		}
	}
	add := func(name string, p point) {
		ser := append(s.series[name], p)
		if len(ser) > s.keep {
			ser = ser[len(ser)-s.keep:]
		}
		s.series[name] = ser
	}
	for _, q := range st.Queues {
		if q.Exists && !q.Unavailable() {
			add(q.Queue, point{st.At, q.Ready, max(q.Poison, 0)})
		}
	}
	add(delaysSeries, point{st.At, st.Delay.Waiting, max(st.Delay.Parked, 0)})
}

// lastStatus returns the last status recorded (zero At if none).
func (s *sampler) lastStatus() ops.Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// chart draws the series of name: ready (or waiting) and poison (or parked) messages over
// the time sampled (the last hour at most), on one scale from 0, with its axes labelled: the
// top of the scale in messages, the time sampled ("-12 min") and now; "" with fewer than 2
// samples.
func (s *sampler) chart(name string, now time.Time) template.HTML {
	ser := s.copy(name)
	if len(ser) < 2 {
		return ""
	}
	const (
		w, h           = 260.0, 60.0
		left, right    = 44.0, w - 4 // the plot's x range
		top, bottom    = 4.0, h - 14 // its y range
		labelX, labelY = left - 4, h - 3
	)
	most := 0
	for _, p := range ser {
		most = max(most, p.ready, p.poison)
	}
	scale := niceCeil(float64(most))
	span := max(now.Sub(ser[0].at), time.Second)
	x := func(t time.Time) float64 { return max(right-(right-left)*float64(now.Sub(t))/float64(span), left) }
	y := func(v int) float64 { return bottom - (bottom-top)*float64(v)/scale }
	line := func(v func(point) int) string {
		var sb strings.Builder
		for _, p := range ser {
			fmt.Fprintf(&sb, "%.1f,%.1f ", x(p.at), y(v(p)))
		}
		return strings.TrimSpace(sb.String())
	}
	last := ser[len(ser)-1]
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg class="chart" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img">`, w, h, w, h)
	fmt.Fprintf(&sb, `<title>messages over the last %s: now %s and %s</title>`, human(span.Round(time.Second)), count(last.ready), count(last.poison))
	fmt.Fprintf(&sb, `<line class="axis" x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f"/><line class="axis" x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f"/>`,
		left, top, left, bottom, left, bottom, right, bottom)
	fmt.Fprintf(&sb, `<line class="grid" x1="%.0f" y1="%.0f" x2="%.0f" y2="%.0f"/>`, left, top, right, top)
	fmt.Fprintf(&sb, `<text x="%.0f" y="%.0f" text-anchor="end">%s msg</text><text x="%.0f" y="%.0f" text-anchor="end">0</text>`,
		labelX, top+7, short(scale), labelX, bottom)
	fmt.Fprintf(&sb, `<text x="%.0f" y="%.0f">-%s</text><text x="%.0f" y="%.0f" text-anchor="end">now</text>`,
		left, labelY, human(span.Round(time.Second)), right, labelY)
	fmt.Fprintf(&sb, `<polyline class="ready" points="%s"/><polyline class="poison" points="%s"/>`+
		`<circle class="ready" cx="%.1f" cy="%.1f" r="2"/><circle class="poison" cx="%.1f" cy="%.1f" r="2"/></svg>`,
		line(func(p point) int { return p.ready }), line(func(p point) int { return p.poison }),
		x(last.at), y(last.ready), x(last.at), y(last.poison))
	return template.HTML(sb.String()) //nolint:gosec // numbers and durations only
}

func (s *sampler) copy(name string) []point {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]point(nil), s.series[name]...)
}

// niceCeil is the least of 1, 2 and 5 times a power of ten that is at least v, and at least 1.
func niceCeil(v float64) float64 {
	for p := 1.0; ; p *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if m*p >= v {
				return m * p
			}
		}
	}
}

// rateWindow is the time over which the overview's rates are taken.
const rateWindow = 5 * time.Minute

// rates says how fast the series of name changed over the last rateWindow (or the time
// sampled, if shorter), per minute: "-120/min, +3/min over 5 min" (ready, then poison); ""
// with fewer than 2 samples.
func (s *sampler) rates(name string, now time.Time) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ser := s.series[name]
	if len(ser) < 2 {
		return ""
	}
	last, first := ser[len(ser)-1], ser[len(ser)-1]
	for i := len(ser) - 1; i >= 0 && now.Sub(ser[i].at) <= rateWindow; i-- {
		first = ser[i]
	}
	span := last.at.Sub(first.at)
	if span <= 0 {
		return ""
	}
	perMin := func(a, b int) string { return fmt.Sprintf("%+.0f/min", float64(b-a)/span.Minutes()) }
	if span >= 10*time.Second { // samples are taken seconds apart: no milliseconds
		span = span.Round(time.Second)
	}
	return fmt.Sprintf("%s, %s over %s", perMin(first.ready, last.ready), perMin(first.poison, last.poison), human(span))
}

// sample records the status of the queues every Config.SampleInterval until Close.
func (h *Handler) sample() {
	defer h.wg.Done()
	t := time.NewTicker(h.cfg.SampleInterval)
	defer t.Stop()
	for {
		ctx, cancel := context.WithTimeout(h.ctx, h.cfg.Timeout)
		st, err := h.status(ctx)
		cancel()
		switch {
		case err == nil:
			st, _ = h.counted(st)
			h.samples.record(st)
		case h.ctx.Err() == nil:
			h.logger.Info("ui: cannot sample the queues", watermill.LogFields{"err": err.Error()})
		}
		select {
		case <-h.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// status reads the status of the queues shown.
func (h *Handler) status(ctx context.Context) (ops.Status, error) {
	queues := h.cfg.Queues
	if len(queues) == 0 {
		var err error
		if queues, err = h.cfg.Ops.WorkQueues(ctx); err != nil {
			return ops.Status{}, fmt.Errorf("list the work queues: %w (set ui.Config.Queues, or the management API in ops.Config.Management)", err)
		}
	}
	return h.cfg.Ops.Status(ctx, queues...)
}

// counted returns st with the poison counts that this Handler's own reads made too low, and
// what it says of the count of each queue it reads ("" for the parking queue). Without the management API
// a count is AMQP's, the messages ready, and a read of a poison queue holds what it took,
// unacknowledged: while a page, a count or a job of this Handler reads a queue, its count is
// replaced by the last one read while none did, or by the count read if that is larger.
// With the management API, Status counts the messages held too (ops.QueueStatus.Poison).
func (h *Handler) counted(st ops.Status) (ops.Status, map[string]string) {
	reading := map[string]bool{}
	if !st.Management {
		for _, q := range st.Queues {
			if q.Poison >= 0 && h.reads.readSince(q.Queue, st.At) {
				reading[q.Queue] = true
			}
		}
		if st.Delay.Parked >= 0 && h.reads.readSince("", st.At) {
			reading[""] = true
		}
	}
	st.Queues = slices.Clone(st.Queues)
	set := h.samples.substitute(&st, reading)
	notes := map[string]string{}
	for q := range reading {
		notes[q] = "this dashboard is reading the queue: its count without the messages the read holds"
		if set[q] {
			notes[q] = "this dashboard is reading the queue: its count before the read began"
		}
	}
	return st, notes
}
