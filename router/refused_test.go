package router_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/consumer"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// logLine is one line an orderedLogger was given.
type logLine struct {
	level  string
	msg    string
	err    string // the error, or the "err" field
	fields watermill.LogFields
	at     time.Time
}

// orderedLogger records the Info and Error lines it is given, in order.
type orderedLogger struct {
	mu    sync.Mutex
	lines []logLine
}

func (l *orderedLogger) add(level, msg string, err error, f watermill.LogFields) {
	line := logLine{level: level, msg: msg, fields: f, at: time.Now()}
	if err != nil {
		line.err = err.Error()
	} else if e, ok := f["err"]; ok {
		line.err = fmt.Sprint(e)
	}
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
}

func (l *orderedLogger) Error(msg string, err error, f watermill.LogFields) {
	l.add("ERROR", msg, err, f)
}
func (l *orderedLogger) Info(msg string, f watermill.LogFields) { l.add("INFO", msg, nil, f) }
func (l *orderedLogger) Debug(string, watermill.LogFields)      {}
func (l *orderedLogger) Trace(string, watermill.LogFields)      {}
func (l *orderedLogger) With(f watermill.LogFields) watermill.LoggerAdapter {
	return withFields{l, f}
}

// withFields is an orderedLogger's With.
type withFields struct {
	l *orderedLogger
	f watermill.LogFields
}

func (w withFields) Error(msg string, err error, f watermill.LogFields) {
	w.l.Error(msg, err, w.f.Add(f))
}
func (w withFields) Info(msg string, f watermill.LogFields) { w.l.Info(msg, w.f.Add(f)) }
func (w withFields) Debug(string, watermill.LogFields)      {}
func (w withFields) Trace(string, watermill.LogFields)      {}
func (w withFields) With(f watermill.LogFields) watermill.LoggerAdapter {
	return withFields{w.l, w.f.Add(f)}
}

func (l *orderedLogger) snapshot() []logLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]logLine(nil), l.lines...)
}

// consumeFailed is the subscriber's line for a failed session, one per backoff step.
const consumeFailed = "Consumer lost its channel, reconnecting"

// A subscription whose consume the broker refuses (541 INTERNAL_ERROR, as on a node whose
// dead-lettering a forged message stopped, for a work queue that is down) backs off, each
// step waiting longer than the first could, and logs each distinct failure at most once per
// backoff step (the broker's refusal once, not again as a lost connection). On a throwaway
// node of its own.
func TestRefusedSubscriptionBacksOffAndLogsOncePerStep(t *testing.T) {
	node := testenv.StartNode(t)
	const q, steps = "refused.work", 6
	cfg := topology.Config{Delay: topology.Delay{Levels: 1}}
	b, err := topology.NewBuilder(cfg, nil)
	require.NoError(t, err)
	require.NoError(t, b.Apply(t.Context(), warren.Connection{URL: node.URL()}, topology.Topology{Queues: []topology.Queue{{Name: q}}}))
	node.StopQueue(q)

	logger := &orderedLogger{}
	sub, err := consumer.NewSubscriber(consumer.Config{Connection: warren.Connection{URL: node.URL()}, Topology: cfg, HandlerName: "refused"}, logger)
	require.NoError(t, err)
	defer sub.Close()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	start := time.Now()
	_, err = sub.Subscribe(ctx, q)
	require.NoError(t, err)
	failures := func() int {
		n := 0
		for _, l := range logger.snapshot() {
			if l.msg == consumeFailed {
				n++
			}
		}
		return n
	}
	require.Eventually(t, func() bool { return failures() >= steps }, 3*testenv.Patience(), 10*time.Millisecond)
	lines := logger.snapshot()
	elapsed := time.Since(start)
	cancel()

	// Steps: the lines up to and including each failure line.
	var step, waits []int
	perStep := map[int]map[string]int{}
	for _, l := range lines {
		k := len(step)
		if perStep[k] == nil {
			perStep[k] = map[string]int{}
		}
		if l.err != "" {
			perStep[k][l.err[:min(len(l.err), 40)]]++
		}
		if l.msg == consumeFailed {
			step = append(step, k)
			in, ok := l.fields["in"].(time.Duration)
			require.True(t, ok, "the failure says how long it waits: %+v", l.fields)
			waits = append(waits, int(in/time.Millisecond))
			require.Contains(t, l.err, "INTERNAL_ERROR")
		}
	}
	var text []string
	for _, l := range lines {
		text = append(text, fmt.Sprintf("%s %s %s %v", l.level, l.msg, l.err, l.fields["in"]))
	}
	t.Logf("%d lines in %s (%.1f a second) over %d backoff steps, waits %v ms:\n%s",
		len(lines), elapsed.Round(time.Millisecond), float64(len(lines))/elapsed.Seconds(), len(step), waits, strings.Join(text, "\n"))
	for k := range len(step) {
		for failure, n := range perStep[k] {
			assert.Equal(t, 1, n, "step %d logs %q %d times", k+1, failure, n)
		}
	}
	// The first wait is 100 ms ±50%; a backoff that grows waits more by the sixth step
	// (100 ms·1.5⁵ ±50% ≥ 379 ms), one that starts over each time at most 150 ms.
	assert.Greater(t, waits[steps-1], 150, "the backoff grows: waits %v ms", waits)
}
