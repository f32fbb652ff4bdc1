package consumer

import (
	"hash/maphash"
	"sync"
	"time"
)

// seenIDs remembers, for seenFor at least, the publish ids (contract.PublishIDHeader) of the
// deliveries a subscriber acked, that is handled for good (processed, retried or poisoned).
// Two generations of a map: one lookup, no per-entry timers. An id is kept as its 64-bit
// hash (see idHash): maps without pointers, which the garbage collector does not scan, of 16
// bytes an entry.
type seenIDs struct {
	mu        sync.Mutex
	cur, prev map[uint64]struct{}
	since     time.Time // cur's start
}

// idSeed seeds the hashes of publish ids, per process.
var idSeed = maphash.MakeSeed()

// idHash returns the hash that stands for a publish id. Two ids of one hash would make the
// second's message taken for a copy of the first's: with at most 2×seenMax ids remembered, the
// odds of that for a new id are below 2×10⁻¹⁴.
func idHash(id string) uint64 { return maphash.String(idSeed, id) }

const (
	seenFor = 5 * time.Minute
	seenMax = 100_000 // ids per generation: a generation ends earlier when it is full
)

func (s *seenIDs) add(id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil || time.Since(s.since) > seenFor || len(s.cur) >= seenMax {
		s.prev, s.cur, s.since = s.cur, make(map[uint64]struct{}), time.Now()
	}
	s.cur[id] = struct{}{}
}

func (s *seenIDs) has(id uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, inCur := s.cur[id]
	_, inPrev := s.prev[id]
	return inCur || inPrev
}

// copies recognises, on one consume channel, the copies of a message (the same publish id: a
// publisher's re-send after a lost confirm, a redelivery after a lost ack, a retry or output
// of such a copy): one the subscriber acked lately, or one being handled on this channel. A
// copy is then acked at once instead of being handled again. The twin being handled on the
// same channel is unacked, so it is settled or delivered again: nothing is lost. (Not so on
// another channel: a channel that closed cannot settle its deliveries, and the message
// redelivered is the twin itself.)
type copies struct {
	seen *seenIDs
	mu   sync.Mutex
	live map[uint64]int // hashes of the ids being handled on this channel
}

// claim reports whether the delivery with publish id is to be handled, and counts it as
// being handled. A delivery without one (not published by warren) always is.
func (c *copies) claim(id string) bool {
	if id == "" {
		return true
	}
	h := idHash(id)
	if c.seen.has(h) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live[h] > 0 {
		return false
	}
	c.live[h]++
	return true
}

// release ends the handling of a claimed id, remembering it when it was acked.
func (c *copies) release(id string, acked bool) {
	if id == "" {
		return
	}
	h := idHash(id)
	c.mu.Lock()
	if c.live[h]--; c.live[h] <= 0 {
		delete(c.live, h)
	}
	c.mu.Unlock()
	if acked {
		c.seen.add(h)
	}
}
