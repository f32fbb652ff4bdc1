package consumer

import "sync"

// keyGate hands out the deliveries of a lane of a queue ordered by key one order key at a
// time: a delivery whose key has a message handed out and not settled waits, unacked, behind
// it, in the order of delivery, and is handed out when the one before it is settled. A
// delivery without a key is not held. It is a session's own: what waits when the channel
// closes goes back to the queue with it, in the queue's order. A message to requeue goes back
// the same way: it stays unacknowledged, its key held, and the session ends (see returning),
// rather than nack it, which would put it after its key's messages received since.
type keyGate struct {
	mu    sync.Mutex
	keys  map[string][]*handout // a key with a message handed out, and those waiting behind it
	ready []*handout            // next of their key, to hand out
	wake  chan struct{}         // a message became ready
	// returning is signalled when a message is to go back to the queue: the session ends
	// (see handout.settle).
	returning chan struct{}
}

func newKeyGate() *keyGate {
	return &keyGate{keys: map[string][]*handout{}, wake: make(chan struct{}, 1), returning: make(chan struct{}, 1)}
}

// admit reports whether h may be handed out now; if not, it waits behind its key.
func (g *keyGate) admit(h *handout) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	waiting, busy := g.keys[h.key]
	if !busy {
		g.keys[h.key] = nil // handed out, none waiting
		return true
	}
	g.keys[h.key] = append(waiting, h)
	return false
}

// settled is told that h, handed out, was settled: to be requeued, which keeps its key held
// until the session ends, or not, which readies the next of its key.
func (g *keyGate) settled(h *handout, requeued bool) {
	if requeued {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	waiting, busy := g.keys[h.key]
	switch {
	case !busy:
		return
	case len(waiting) == 0:
		delete(g.keys, h.key)
		return
	}
	g.ready = append(g.ready, waiting[0])
	g.keys[h.key] = waiting[1:]
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
	for _, waiting := range g.keys {
		for _, h := range waiting {
			h.done()
		}
	}
	g.ready, g.keys = nil, map[string][]*handout{}
}
