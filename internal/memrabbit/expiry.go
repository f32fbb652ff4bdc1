package memrabbit

import (
	"container/heap"
	"time"
)

// The heads of queues expire on one goroutine of the broker, the expirer: it waits for the
// soonest expiration among the queues (expiring holds them, soonest first), expires what is
// due and dispatches. It starts with an expiration set while none runs, on the goroutine that
// sets it (in a testing/synctest bubble, the bubble's), and ends when no queue's head has an
// expiration or the broker closes: a broker with nothing to expire has no goroutine of its own.
// One goroutine for the expirations that follow one another, rather than a timer's goroutine
// for each, whose stack grew anew to dead-letter and deliver.

// expiring is a heap of queues by when their head expires (queue.armed), the earlier armed
// first among equals.
type expiring []*queue

func (h expiring) Len() int { return len(h) }
func (h expiring) Less(i, j int) bool {
	if !h[i].armed.Equal(h[j].armed) {
		return h[i].armed.Before(h[j].armed)
	}
	return h[i].armSeq < h[j].armSeq
}
func (h expiring) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapAt, h[j].heapAt = i, j
}
func (h *expiring) Push(x any) {
	q := x.(*queue)
	q.heapAt = len(*h)
	*h = append(*h, q)
}
func (h *expiring) Pop() any {
	old := *h
	q := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	q.heapAt = -1
	return q
}

// setExpiryLocked has q's head expire at at (zero: q's head does not expire), and wakes or
// starts the expirer when that is now the soonest expiration.
func (b *Broker) setExpiryLocked(q *queue, at time.Time) {
	if q.armed.Equal(at) {
		return
	}
	q.armed = at
	if at.IsZero() {
		if q.heapAt >= 0 {
			heap.Remove(&b.expiring, q.heapAt)
		}
		return // the expirer, woken for nothing, waits again
	}
	b.armSeq++
	q.armSeq = b.armSeq
	if q.heapAt >= 0 {
		heap.Fix(&b.expiring, q.heapAt)
	} else {
		heap.Push(&b.expiring, q)
	}
	if q.heapAt != 0 {
		return
	}
	if b.wake == nil {
		b.wake = make(chan struct{}, 1)
		go b.expire(b.wake)
		return
	}
	select {
	case b.wake <- struct{}{}:
	default: // already told
	}
}

// expire is the expirer: it expires the heads of queues when they are due, until no queue's
// head has an expiration or the broker closes.
func (b *Broker) expire(wake chan struct{}) {
	var timer *time.Timer
	b.mu.Lock()
	defer b.mu.Unlock()
	for {
		if b.closed || len(b.expiring) == 0 {
			b.wake = nil
			if timer != nil {
				timer.Stop()
			}
			return
		}
		now := time.Now()
		if d := b.expiring[0].armed.Sub(now); d > 0 {
			if timer == nil {
				timer = time.NewTimer(d)
			} else {
				timer.Reset(d)
			}
			b.mu.Unlock()
			select {
			case <-timer.C:
			case <-wake:
			}
			b.mu.Lock()
			continue
		}
		for len(b.expiring) > 0 && !b.expiring[0].armed.After(now) {
			q := heap.Pop(&b.expiring).(*queue)
			q.armed = time.Time{}
			b.armExpiryLocked(q)
		}
		b.dispatchLocked()
	}
}
