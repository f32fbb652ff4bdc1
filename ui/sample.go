package ui

import (
	"context"
	"fmt"
	"html/template"
	"math"
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
	return &sampler{keep: keep, series: map[string][]point{}}
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

// chart draws the series of name as an SVG: ready (or waiting) and poison (or parked) over
// the time sampled (the last hour at most), both on one scale; "" with fewer than 2 samples.
func (s *sampler) chart(name string, now time.Time) template.HTML {
	ser := s.copy(name)
	if len(ser) < 2 {
		return ""
	}
	ready, poison := make([]float64, len(ser)), make([]float64, len(ser))
	for i, p := range ser {
		ready[i], poison[i] = float64(p.ready), float64(p.poison)
	}
	last := ser[len(ser)-1]
	return draw(ser, ready, poison, now, false, fmt.Sprintf("depth now %d and %d", last.ready, last.poison))
}

// rateChart draws how fast the series of name changed from one sample to the next, per
// minute, above and below a zero line; "" with fewer than 3 samples.
func (s *sampler) rateChart(name string, now time.Time) template.HTML {
	all := s.copy(name)
	if len(all) < 3 {
		return ""
	}
	prev, ser := all[0], all[1:]
	ready, poison := make([]float64, len(ser)), make([]float64, len(ser))
	for i, p := range ser {
		m := p.at.Sub(prev.at).Minutes()
		ready[i], poison[i] = float64(p.ready-prev.ready)/m, float64(p.poison-prev.poison)/m
		prev = p
	}
	return draw(ser, ready, poison, now, true, "change per minute")
}

func (s *sampler) copy(name string) []point {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]point(nil), s.series[name]...)
}

// draw draws the two series a (ready) and b (poison), sampled at ser's times, on one scale:
// from 0 up, or around a zero line in the middle when signed.
func draw(ser []point, a, b []float64, now time.Time, signed bool, what string) template.HTML {
	const w, h = 240.0, 36.0
	top := 1.0
	for i := range a {
		top = max(top, math.Abs(a[i]), math.Abs(b[i]))
	}
	span := max(now.Sub(ser[0].at), time.Second)
	x := func(t time.Time) float64 { return max(w*(1-float64(now.Sub(t))/float64(span)), 0) }
	y := func(v float64) float64 {
		if signed {
			return h/2 - (h/2-2)*v/top
		}
		return h - 2 - (h-4)*v/top
	}
	line := func(vs []float64) string {
		var sb strings.Builder
		for i, p := range ser {
			fmt.Fprintf(&sb, "%.1f,%.1f ", x(p.at), y(vs[i]))
		}
		return strings.TrimSpace(sb.String())
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg class="chart" viewBox="0 0 %.0f %.0f" width="%.0f" height="%.0f" role="img"><title>the last %s, %s, top %.0f</title>`,
		w, h, w, h, span.Round(time.Second), what, top)
	if signed {
		fmt.Fprintf(&sb, `<line class="zero" x1="0" y1="%.1f" x2="%.0f" y2="%.1f"/>`, h/2, w, h/2)
	}
	n := len(ser) - 1
	fmt.Fprintf(&sb, `<polyline class="ready" points="%s"/><polyline class="poison" points="%s"/>`+
		`<circle class="ready" cx="%.1f" cy="%.1f" r="2"/><circle class="poison" cx="%.1f" cy="%.1f" r="2"/></svg>`,
		line(a), line(b), x(ser[n].at), y(a[n]), x(ser[n].at), y(b[n]))
	return template.HTML(sb.String()) // numbers only
}

// rateWindow is the time over which the overview's rates are taken.
const rateWindow = 5 * time.Minute

// rates says how fast the series of name changed over the last rateWindow (or the time
// sampled, if shorter), per minute: "ready -120/min, poison +3/min over 5m0s"; "" with fewer
// than 2 samples.
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
	round := time.Second
	if span < 10*time.Second {
		round = time.Millisecond
	}
	return fmt.Sprintf("%s, %s over %s", perMin(first.ready, last.ready), perMin(first.poison, last.poison), span.Round(round))
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
