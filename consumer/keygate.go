package consumer

import "sync"

// keyGate hands out the deliveries of a lane of a queue ordered by key one order key at a
// time: a delivery whose key has a message handed out and not settled waits, unacked, behind
// it, in the order of delivery, and is handed out when the one before it is settled. A
// delivery without a key is not held. It is a session's own: what waits when the channel
// closes goes back to the queue with it, in the queue's order. A message to requeue goes back
// the same way: it stays unacknowledged, its key held, and the session ends (see returning),
// rather than nack it, which would put it after its key's messages received since. Should the
// broker deliver it again in the same session, it is handed out before them.
type keyGate struct {
	mu    sync.Mutex
	keys  map[string]*keyLine
	ready []*handout    // next of their key, to hand out
	wake  chan struct{} // a message became ready
	// returning is signalled when a message is to go back to the queue: the session ends
	// (see handout.settle).
	returning chan struct{}
}

// keyLine is a key with a message handed out: the ones that wait behind it, and the publish
// id of one that was requeued and is to come back first ("" when none).
type keyLine struct {
	waiting   []*handout
	returning string
}

func newKeyGate() *keyGate {
	return &keyGate{keys: map[string]*keyLine{}, wake: make(chan struct{}, 1), returning: make(chan struct{}, 1)}
}

// admit reports whether h may be handed out now; if not, it waits in its key's line.
func (g *keyGate) admit(h *handout) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	line := g.keys[h.key]
	switch {
	case line == nil:
		g.keys[h.key] = &keyLine{}
		return true
	case line.returning != "" && line.returning == h.id:
		line.returning = ""
		return true
	}
	line.waiting = append(line.waiting, h)
	return false
}

// settled is told that h, handed out, was settled: requeued (which holds its key until it
// comes back) or not (which readies the next of its key).
func (g *keyGate) settled(h *handout, requeued bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	line := g.keys[h.key]
	if line == nil {
		return
	}
	if requeued && h.id != "" {
		line.returning = h.id
		return
	}
	if len(line.waiting) == 0 {
		delete(g.keys, h.key)
		return
	}
	g.ready = append(g.ready, line.waiting[0])
	line.waiting = line.waiting[1:]
	select {
	case g.wake <- struct{}{}:
	default:
	}
}

// next returns the oldest message whose turn came, or nil.
func (g *keyGate) next() *handout {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.ready) == 0 {
		return nil
	}
	h := g.ready[0]
	g.ready = g.ready[1:]
	return h
}

// drop ends the contexts of the messages that wait or are ready, when the session ends: their
// deliveries go back to the queue with the channel.
func (g *keyGate) drop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, h := range g.ready {
		h.done()
	}
	for _, line := range g.keys {
		for _, h := range line.waiting {
			h.done()
		}
	}
	g.ready, g.keys = nil, map[string]*keyLine{}
}
