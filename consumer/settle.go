package consumer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/contract"
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
	gate     *keyGate // of a lane of a queue ordered by key; nil for others
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

// handout is a message handed out and not settled yet: the value of its context (see
// contract.Handling), and what settles its delivery.
type handout struct {
	contract.Handling
	sub *subscription
	cs  *channelState
	msg *message.Message
	tag uint64
	id  string // publish id
	key string // order key, in a lane of a queue ordered by key (see keyGate)
	// In a lane of a queue ordered by key: the delivery (a held key's is parked as it is),
	// and whether it is a held message moved back (contract.ReleasedHeader).
	raw     *amqp.Delivery
	marked  bool
	done    context.CancelFunc
	settled atomic.Bool
}

// await settles the delivery once the receiver of the message has acked or nacked it.
func (h *handout) await() {
	select {
	case <-h.msg.Acked():
		h.settle(true)
	case <-h.msg.Nacked():
		h.settle(false)
	}
}

// Settle settles the delivery as the receiver of the message says, once (see
// contract.Settler): a requeue, which waits, on a goroutine of its own.
func (h *handout) Settle(acked bool) {
	if h.settled.Swap(true) {
		return
	}
	if acked || h.DeadLetterRequested() {
		h.settle(acked)
		return
	}
	go h.settle(false)
}

// settle settles the delivery as settleAs does, remembering a message acked.
func (h *handout) settle(acked bool) { h.settleAs(acked, acked) }

// settleAs acks the delivery of a message acked (and remembers its publish id, see copies,
// if it was handled), and then ends the message's context. A nacked one goes back to the
// queue after RequeueDelay (at once when the consumer stops), or, if contract.DeadLetter was
// called, is rejected into the queue's dead-letter path.
func (h *handout) settleAs(acked, handled bool) {
	cs := h.cs
	defer cs.inflight.done()
	defer func() { <-cs.slots }()
	defer h.done()
	cs.dups.release(h.id, handled) // a nacked one is never remembered: a reject lost with its channel must be handled again
	if h.key != "" && cs.gate != nil {
		cs.gate.settled(h, !acked && !h.DeadLetterRequested())
		if h.marked {
			h.sub.holds.movedSettled(h.key)
		}
	}
	if acked {
		cs.acks.settle(h.tag, ack)
		return
	}
	if h.DeadLetterRequested() {
		cs.acks.settle(h.tag, reject)
		return
	}
	if cs.gate != nil {
		// A lane ordered by key: a message requeued while the consumer is active would come
		// back after the ones of its key received since. It stays unacknowledged, its key
		// held, and the session ends: the channel's close returns it and them in order.
		select {
		case cs.gate.returning <- struct{}{}:
		default:
		}
		return
	}
	h.sub.requeueLater(h.tag, cs)
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
