package ui

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/warrenmq/warren/ops"
)

// snapshot is what a page read of a queue: its first messages, bodies included and redacted
// (Config.Redact), and the queue's depth then.
type snapshot struct {
	at    time.Time // when the read began
	done  time.Time // when it ended
	msgs  []ops.Message
	depth int // -1 if not known
}

// snapshots are the last reads of each poison queue (by work queue) and of the parking
// queue (""), reused for Config.SnapshotAge and then dropped, and the locks that let one
// reader at a time take a queue's messages.
//
// AMQP 0-9-1 reads a queue by taking its messages: two readers of one queue at once would
// each see only what the other does not hold. So a page's read, a count, a message looked
// for in the whole queue and a replay or delete job each hold the queue's lock while they
// take its messages. A page's read waits for the read under way and then uses the snapshot
// it made. While a job holds a queue, its pages and counts do not wait (a job can take
// minutes): they are refused at once with errJobRuns, and the job drops the queue's
// snapshot when it starts and when it ends, since it changes the queue.
type snapshots struct {
	age   time.Duration // Config.SnapshotAge
	mu    sync.Mutex
	m     map[string]snapshot
	locks map[string]*queueLock
	// released is when a reader last let each queue go.
	released map[string]time.Time
}

// queueLock is the lock of one queue.
type queueLock struct {
	token chan struct{} // holds a value while a reader holds the queue
	refs  int           // readers holding or waiting for it; at 0 the lock is dropped
	job   *job          // the job holding it, if one does
}

// errJobRuns is wrapped by the error of a read refused because a job holds the queue.
var errJobRuns = errors.New("a replay or delete of this queue is under way")

func newSnapshots(age time.Duration) *snapshots {
	return &snapshots{age: age, m: map[string]snapshot{}, locks: map[string]*queueLock{}, released: map[string]time.Time{}}
}

// readSince reports whether a reader of this Handler took messages of queue at any time
// since t: one holds the queue now, or let it go after t.
func (s *snapshots) readSince(queue string, t time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.locks[queue]; l != nil && len(l.token) > 0 {
		return true
	}
	return s.released[queue].After(t)
}

// get returns the snapshot of queue if it is younger than the snapshots' age. It drops the
// ones that are older, of every queue.
func (s *snapshots) get(queue string) (snapshot, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evict()
	r, ok := s.m[queue]
	return r, ok
}

func (s *snapshots) put(queue string, r snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.evict()
	s.m[queue] = r
}

// evict drops the snapshots older than the snapshots' age. s.mu is held.
func (s *snapshots) evict() {
	for q, r := range s.m {
		if time.Since(r.at) > s.age {
			delete(s.m, q)
		}
	}
}

// forget drops the snapshot of queue: an action changes it.
func (s *snapshots) forget(queue string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, queue)
}

// lock waits until the caller alone reads queue, or ctx ends, and returns the function that
// lets the queue go. j is the job that asks, nil for a page; a page is refused at once, with
// errJobRuns, while a job holds the queue.
func (s *snapshots) lock(ctx context.Context, queue string, j *job) (unlock func(), err error) {
	s.mu.Lock()
	l := s.locks[queue]
	if l == nil {
		l = &queueLock{token: make(chan struct{}, 1)}
		s.locks[queue] = l
	}
	if j == nil && l.job != nil {
		err := fmt.Errorf("%w (job %s): read it again when it ends", errJobRuns, l.job.ID)
		s.dropIfUnused(queue, l)
		s.mu.Unlock()
		return nil, err
	}
	l.refs++
	s.mu.Unlock()
	select {
	case l.token <- struct{}{}:
	case <-ctx.Done():
		s.mu.Lock()
		l.refs--
		s.dropIfUnused(queue, l)
		s.mu.Unlock()
		return nil, fmt.Errorf("wait for the read of the queue under way: %w", ctx.Err())
	}
	s.mu.Lock()
	l.job = j
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		l.job = nil
		s.released[queue] = time.Now()
		<-l.token // the caller's: never blocks
		l.refs--
		s.dropIfUnused(queue, l)
	}, nil
}

// dropIfUnused drops the lock l of queue if no reader holds or waits for it. s.mu is held.
func (s *snapshots) dropIfUnused(queue string, l *queueLock) {
	if l.refs == 0 {
		delete(s.locks, queue)
	}
}

// browse reads the poison queue of queue, or the parking queue for "".
func (h *Handler) browse(ctx context.Context, queue string, b ops.Browse) ([]ops.Message, error) {
	if queue == "" {
		return h.cfg.Ops.Parked(ctx, b)
	}
	return h.cfg.Ops.Poisoned(ctx, queue, b)
}

// browseAlone is browse while the caller alone reads queue (see snapshots).
func (h *Handler) browseAlone(ctx context.Context, queue string, b ops.Browse) ([]ops.Message, error) {
	unlock, err := h.reads.lock(ctx, queue, nil)
	if err != nil {
		return nil, err
	}
	defer unlock()
	return h.browse(ctx, queue, b)
}

// redacted is m as Config.Redact leaves a copy of it (m itself if there is no Redact).
func (h *Handler) redacted(m ops.Message) ops.Message {
	if h.cfg.Redact == nil {
		return m
	}
	return ops.Redacted(m, h.cfg.Redact)
}

// read returns the first Config.ScanLimit messages of the poison queue of queue (the parking
// queue for ""), each redacted (Config.Redact), from a snapshot unless it is older than
// Config.SnapshotAge or fresh is set. A read that ended while this one waited for the queue
// serves it, fresh or not: the two were asked at the same time.
func (h *Handler) read(ctx context.Context, queue string, fresh bool) (snapshot, error) {
	asked := time.Now()
	if r, ok := h.reads.get(queue); ok && !fresh {
		return r, nil
	}
	unlock, err := h.reads.lock(ctx, queue, nil)
	if err != nil {
		return snapshot{depth: -1}, err
	}
	defer unlock()
	if r, ok := h.reads.get(queue); ok && (!fresh || r.done.After(asked)) {
		return r, nil
	}
	r := snapshot{at: time.Now(), depth: -1}
	scan := max(h.cfg.ScanLimit, 0)
	if r.msgs, err = h.browse(ctx, queue, ops.Browse{Bodies: true, Scan: scan}); err != nil {
		return r, err
	}
	for i, m := range r.msgs {
		r.msgs[i] = h.redacted(m)
	}
	r.depth = len(r.msgs)
	if len(r.msgs) == scan { // there may be more: ask (the browse has handed them back)
		if n, err := h.cfg.Ops.Depth(ctx, queue); err == nil {
			r.depth = n
		}
	}
	r.done = time.Now()
	h.reads.put(queue, r)
	return r, nil
}
