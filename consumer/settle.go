package consumer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// channelState is what one consume channel's deliveries share: the acker, the messages
// handed out and not settled, the copies being handled, the handler slots, stopping,
// closed when the consumer stops (nothing waits to be requeued any more), and the parent
// of the context of its messages, ended when its stop outlives ShutdownTimeout. It is the
// session's own: a pause or a reconnect that ended it never cancels the messages that the
// next session hands out.
type channelState struct {
	acks     *acker
	inflight flights
	dups     *copies
	stopping chan struct{}
	slots    chan struct{} // one per message handed out, up to Concurrency
	hardStop context.Context
	hardFn   context.CancelCauseFunc
}

// flights counts the messages handed out and not settled yet.
type flights struct {
	sync.WaitGroup
	n atomic.Int64
}

func (f *flights) add() {
	f.n.Add(1)
	f.Add(1)
}

func (f *flights) done() {
	f.n.Add(-1)
	f.Done()
}

// settle acks the delivery once the handler has acked msg (and remembers its publish id, see
// copies), and then ends msg's context. A nacked one goes back to the queue after
// RequeueDelay (at once when the consumer stops), or, if contract.DeadLetter was called, is
// rejected into the queue's dead-letter path.
func (sub *subscription) settle(cs *channelState, msg *message.Message, tag uint64, id string,
	done context.CancelFunc, deadLetter *atomic.Bool) {
	defer cs.inflight.done()
	defer func() { <-cs.slots }()
	defer done()
	select {
	case <-msg.Acked():
		cs.dups.release(id, true)
		cs.acks.settle(tag, ack)
	case <-msg.Nacked():
		cs.dups.release(id, false) // a reject lost with its channel must be handled again
		if deadLetter.Load() {
			cs.acks.settle(tag, reject)
			return
		}
		sub.requeueLater(tag, cs)
	}
}

// requeueLater returns the delivery to the queue after RequeueDelay, or at once when the
// consumer stops or the subscriber closes.
func (sub *subscription) requeueLater(tag uint64, cs *channelState) {
	t := time.NewTimer(sub.s.cfg.RequeueDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-cs.stopping:
	case <-sub.s.closing:
	}
	cs.acks.settle(tag, requeue)
}
