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

// browse reads the poison queue of queue, or the parking queue for "".
func (h *Handler) browse(ctx context.Context, queue string, b ops.Browse) ([]ops.Message, error) {
	if queue == "" {
		return h.cfg.Ops.Parked(ctx, b)
	}
	return h.cfg.Ops.Poisoned(ctx, queue, b)
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
	var err error
	scan := max(h.cfg.ScanLimit, 0)
	if r.msgs, err = h.browse(ctx, queue, ops.Browse{Bodies: true, Scan: scan}); err != nil {
		return r, err
	}
	r.depth = len(r.msgs)
	if len(r.msgs) == scan { // there may be more: ask (the browse has handed them back)
		if n, err := h.cfg.Ops.Depth(ctx, queue); err == nil {
			r.depth = n
		}
	}
	h.reads.put(queue, r)
	return r, nil
}
