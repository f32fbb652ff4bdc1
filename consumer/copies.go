package consumer

import (
	"sync"
	"time"
)

// seenIDs remembers, for seenFor at least, the publish ids (contract.PublishIDHeader) of the
// deliveries a subscriber acked, that is handled for good (processed, retried or poisoned).
// Two generations of a map: one lookup, no per-entry timers.
type seenIDs struct {
	mu        sync.Mutex
	cur, prev map[string]struct{}
	since     time.Time // cur's start
}

const (
	seenFor = 5 * time.Minute
	seenMax = 100_000 // ids per generation: a generation ends earlier when it is full
)

func (s *seenIDs) add(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil || time.Since(s.since) > seenFor || len(s.cur) >= seenMax {
		s.prev, s.cur, s.since = s.cur, make(map[string]struct{}), time.Now()
	}
	s.cur[id] = struct{}{}
}

func (s *seenIDs) has(id string) bool {
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
	live map[string]int // ids being handled on this channel
}

// claim reports whether the delivery with publish id is to be handled, and counts it as
// being handled. A delivery without one (not published by warren) always is.
func (c *copies) claim(id string) bool {
	if id == "" {
		return true
	}
	if c.seen.has(id) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live[id] > 0 {
		return false
	}
	c.live[id]++
	return true
}

// release ends the handling of a claimed id, remembering it when it was acked.
func (c *copies) release(id string, acked bool) {
	if id == "" {
		return
	}
	c.mu.Lock()
	if c.live[id]--; c.live[id] <= 0 {
		delete(c.live, id)
	}
	c.mu.Unlock()
	if acked {
		c.seen.add(id)
	}
}
