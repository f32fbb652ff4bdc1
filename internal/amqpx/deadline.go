package amqpx

import (
	"context"
	"sync"
	"time"
)

// deadlineSlot is how late a context of withDeadline may end: the deadlines within one slot
// share a timer.
const deadlineSlot = 10 * time.Millisecond

// withDeadline returns ctx bounded by deadline, as context.WithDeadline does. When ctx can
// never end by itself (the usual case of a publish: its messages' contexts are
// context.Background), the context returned ends at the end of deadline's slot, up to
// deadlineSlot later, and its deadline says so: it shares its timer and Done channel with
// every other one of the same slot, and under context.Background it is the same context. A
// call then costs no timer and no allocation. The rule behind it: a time limit of seconds
// needs no nanosecond precision, while a timer per call is paid at every message.
//
// A deadline whose wall clock is behind the process's start (a fake clock: testing/synctest's
// bubbles start at 2000-01-01) gets a context of its own: the slots are the process's, and a
// bubble's timers and channels are its own.
func withDeadline(ctx context.Context, deadline time.Time) (context.Context, context.CancelFunc) {
	if ctx.Done() != nil || deadline.Round(0).Before(slotBase.Round(0)) {
		return context.WithDeadline(ctx, deadline)
	}
	slot := slotOf(deadline)
	if ctx == context.Background() {
		return slot, func() {}
	}
	return &slotContext{Context: ctx, deadline: slot.deadline, done: slot.done}, func() {}
}

// slotContext is a context that ends at its slot's end (see withDeadline), under a parent
// that never ends.
type slotContext struct {
	context.Context
	deadline time.Time
	done     chan struct{}
}

func (c *slotContext) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *slotContext) Done() <-chan struct{} { return c.done }

func (c *slotContext) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// slotBase is where the slots are counted from: a reading of the monotonic clock, which wall
// clock changes do not move.
var slotBase = time.Now()

// slots holds the slots whose ends are still to come, by number, each as a context under
// context.Background.
var slots = struct {
	sync.Mutex
	byNumber map[int64]*slotContext
}{byNumber: map[int64]*slotContext{}}

// slotOf returns deadline's slot, whose timer it starts if it is the first of it.
func slotOf(deadline time.Time) *slotContext {
	n := int64(deadline.Sub(slotBase)/deadlineSlot) + 1
	slots.Lock()
	defer slots.Unlock()
	s := slots.byNumber[n]
	if s == nil {
		end := slotBase.Add(time.Duration(n) * deadlineSlot)
		s = &slotContext{Context: context.Background(), deadline: end, done: make(chan struct{})}
		slots.byNumber[n] = s
		time.AfterFunc(time.Until(end), func() {
			slots.Lock()
			delete(slots.byNumber, n)
			slots.Unlock()
			close(s.done)
		})
	}
	return s
}
