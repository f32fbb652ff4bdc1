package ui

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Snapshots older than their age are dropped when another is stored or looked for.
func TestSnapshotsAreDroppedWhenOld(t *testing.T) {
	s := newSnapshots(time.Minute)
	s.put("old", snapshot{at: time.Now().Add(-2 * time.Minute)})
	s.put("new", snapshot{at: time.Now()})
	assert.NotContains(t, s.m, "old")
	assert.Contains(t, s.m, "new")

	s.m["old"] = snapshot{at: time.Now().Add(-2 * time.Minute)}
	_, ok := s.get("new")
	assert.True(t, ok)
	assert.NotContains(t, s.m, "old")
	_, ok = s.get("old")
	assert.False(t, ok)
}

// One reader at a time takes a queue's messages: a page waits for another page's read; a
// page is refused at once while a job holds the queue. A lock goes once free.
func TestQueueLock(t *testing.T) {
	s := newSnapshots(time.Minute)
	ctx := context.Background()
	unlock, err := s.lock(ctx, "q", nil)
	require.NoError(t, err)
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	_, err = s.lock(short, "q", nil)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "a page waits for the read under way")
	other, err := s.lock(ctx, "other", nil)
	require.NoError(t, err, "another queue is read meanwhile")
	other()
	unlock()

	j := &job{jobView: jobView{ID: "7", Action: ActionReplay, Queue: "q"}}
	unlockJob, err := s.lock(ctx, "q", j)
	require.NoError(t, err)
	_, err = s.lock(ctx, "q", nil) // no deadline: refused at once, or the test hangs
	require.ErrorIs(t, err, errJobRuns)
	assert.EqualError(t, err, "a replay or delete of this queue is under way (job 7): read it again when it ends")

	unlockJob()
	unlock, err = s.lock(ctx, "q", nil)
	require.NoError(t, err, "read once the job ended")
	unlock()
	assert.Empty(t, s.locks, "a lock is dropped once no one holds or waits for it")
}
