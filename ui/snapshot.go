package ui

import (
	"context"
	"sync"
	"time"

	"github.com/warrenmq/warren/ops"
)

// snapshot is what a page read of a queue: its first messages, bodies included, and the
// queue's depth then.
type snapshot struct {
	at    time.Time
	msgs  []ops.Message
	depth int // -1 if not known
}

// snapshots are the last reads of each poison queue (by work queue) and of the parking
// queue (""), reused for Config.SnapshotAge.
type snapshots struct {
	mu sync.Mutex
	m  map[string]snapshot
}

func (s *snapshots) get(queue string, maxAge time.Duration) (snapshot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.m[queue]
	return r, ok && time.Since(r.at) <= maxAge
}

func (s *snapshots) put(queue string, r snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[queue] = r
}

// forget drops the snapshot of queue: an action changed it.
func (s *snapshots) forget(queue string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, queue)
}

// read returns the first Config.ScanLimit messages of the poison queue of queue (the parking
// queue for ""), from a snapshot unless it is older than Config.SnapshotAge or fresh is set.
func (h *Handler) read(ctx context.Context, queue string, fresh bool) (snapshot, error) {
	if r, ok := h.reads.get(queue, h.cfg.SnapshotAge); ok && !fresh {
		return r, nil
	}
	r := snapshot{at: time.Now(), depth: -1}
	b := ops.Browse{Bodies: true, Scan: max(h.cfg.ScanLimit, 0)}
	var err error
	if queue == "" {
		r.msgs, err = h.cfg.Ops.Parked(ctx, b)
	} else {
		r.msgs, err = h.cfg.Ops.Poisoned(ctx, queue, b)
	}
	if err != nil {
		return r, err
	}
	r.depth = len(r.msgs)
	if len(r.msgs) == b.Scan { // there may be more: ask
		var queues []string
		if queue != "" {
			queues = []string{queue}
		}
		if st, err := h.cfg.Ops.Status(ctx, queues...); err == nil { // the browse has handed them back
			r.depth = st.Delay.Parked
			if queue != "" {
				r.depth = st.Queues[0].Poison
			}
		}
	}
	h.reads.put(queue, r)
	return r, nil
}
