package ui

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/ops"
)

// statusAt is a status read at at, of the queues named, each with one ready message.
func statusAt(at time.Time, queues ...string) ops.Status {
	st := ops.Status{At: at}
	for _, q := range queues {
		st.Queues = append(st.Queues, ops.QueueStatus{Queue: q, Exists: true, Ready: 1})
	}
	return st
}

// The series hold the sampler's samples in time order, and only of the queues the last one
// lists; the overview's statuses are kept as the last status, not as samples.
func TestSamplerKeepsSamplesInOrderOfListedQueues(t *testing.T) {
	s := newSampler(time.Minute)
	t0 := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	s.record(statusAt(t0, "a", "b", "c"))
	s.record(statusAt(t0.Add(time.Minute), "a", "b", "c"))
	require.Len(t, s.copy("b"), 2)

	s.record(statusAt(t0.Add(30*time.Second), "a")) // read before the last one, ended after it
	assert.Len(t, s.copy("a"), 2, "a sample older than the last one is ignored")
	assert.Len(t, s.copy("b"), 2)
	assert.Equal(t, t0.Add(time.Minute), s.lastStatus().At)

	gone := statusAt(t0.Add(2*time.Minute), "a", "c")
	gone.Queues[1].Exists = false
	s.record(gone)
	assert.Len(t, s.copy("a"), 3)
	assert.NotContains(t, s.series, "b", "no longer listed")
	assert.NotContains(t, s.series, "c", "no longer exists")
	assert.Contains(t, s.series, delaysSeries)

	s.remember(statusAt(t0.Add(3*time.Minute), "a"))
	assert.Len(t, s.copy("a"), 3, "an overview's read is no sample")
	assert.Equal(t, t0.Add(3*time.Minute), s.lastStatus().At)
	s.remember(statusAt(t0.Add(150*time.Second), "a"))
	assert.Equal(t, t0.Add(3*time.Minute), s.lastStatus().At, "an older read is not kept as the last")
	s.record(statusAt(t0.Add(150*time.Second), "a"))
	assert.Len(t, s.copy("a"), 4, "a sample newer than the last sample counts")
	assert.Equal(t, t0.Add(3*time.Minute), s.lastStatus().At)
}
