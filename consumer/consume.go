package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/consumerconns"
)

// consume consumes the queue on a channel of its own of conn, cc's connection, until closed,
// killed or drained, or until an error: the channel or connection is lost, or the queue is
// deleted (errQueueGone).
func (sub *subscription) consume(ctx context.Context, cc *consumerconns.Conn, conn *amqp.Connection, commands <-chan amqp.Delivery) (outcome, error) {
	s := sub.s
	ch, err := conn.Channel()
	if err != nil {
		return closed, err
	}
	defer ch.Close()
	if err := ch.Qos(s.cfg.Prefetch, 0, false); err != nil {
		return closed, err
	}
	cancelled := ch.NotifyCancel(make(chan string, 1))
	closedBy := ch.NotifyClose(make(chan *amqp.Error, 1))
	tag := fmt.Sprintf("warren-%s-%d", s.cfg.HandlerName, consumerSeq.Add(1))
	cc.Consuming.Lock() // one at a time: a refusal that closes conn is this consume's (see consumerconns.Conns)
	deliveries, err := ch.Consume(sub.queue, tag, false, false, false, false, nil)
	cc.Consuming.Unlock()
	if closesConnection(err) && cc == s.conns.Main {
		sub.isolated = true
		// The failure itself is logged once, by run.
		s.logger.Info("Consumer refused with a connection error: it retries on a connection of its own until it is served",
			watermill.LogFields{"queue": sub.queue})
	}
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code != amqp.NotFound && amqpx.IsPermanentBrokerError(err) {
		return closed, fmt.Errorf("%w: %v", errRefused, err)
	}
	if err != nil {
		return closed, sub.goneOr(conn, err)
	}
	sub.markReady()
	sub.steady = true

	cs := &channelState{
		acks:     newAcker(ch, s.cfg.Prefetch, s.logger),
		dups:     &copies{seen: &s.seen, live: map[string]int{}},
		stopping: make(chan struct{}),
		slots:    make(chan struct{}, s.cfg.Concurrency),
	}
	cs.hardStop, cs.hardFn = context.WithCancelCause(s.hardStop)
	defer cs.acks.close()
	defer func() { // the session's context goes once its last message is settled
		go func() {
			cs.inflight.Wait()
			cs.hardFn(context.Canceled)
		}()
	}()
	stop := func() {
		close(cs.stopping)
		sub.stop(ch, tag, deliveries, cs)
	}
	var drainTick <-chan time.Time
	if sub.mode == draining {
		t := time.NewTicker(drainCheck)
		defer t.Stop()
		drainTick = t.C
	}
	slot := false // a handler slot is held for the next delivery
	for {
		// A delivery is taken only with a free slot: at most Concurrency are handed out, the
		// rest of the prefetch waits, and commands, closing and the context are still heard.
		in, take := deliveries, (chan<- struct{})(nil)
		if !slot {
			in, take = nil, cs.slots
		}
		select {
		case take <- struct{}{}:
			slot = true
		case _, sent := <-cancelled:
			if !sent { // closed, not sent to, when the channel closes: deliveries ends too
				cancelled = nil
				continue
			}
			return closed, sub.cancelledByBroker(conn, stop, cs)
		case d, ok := <-in:
			if !ok {
				select {
				case _, sent := <-cancelled:
					if sent {
						return closed, sub.cancelledByBroker(conn, stop, cs)
					}
				default:
				}
				close(cs.stopping)
				return closed, channelLost(closedBy)
			}
			sub.recordLateness(d)
			id, _ := d.Headers[warren.PublishIDHeader].(string)
			if !cs.dups.claim(id) {
				s.logger.Info("Copy of a message handled already: acked", watermill.LogFields{"queue": sub.queue, "message_id": d.MessageId})
				cs.acks.settle(d.DeliveryTag, ack)
				continue
			}
			msg, done, deadLetter := sub.message(d, id, cs)
			if msg == nil {
				cs.dups.release(id, false) // poisoned, or put back: never taken for done
				continue
			}
			info, _ := warren.DeliveryFrom(msg.Context()) // read before the handler owns msg
			consumed := s.consumes.Get(sub.queue, info.Exchange)
			select {
			case sub.out <- msg:
				slot = false // settle frees it
				s.metrics.Consumed(context.Background(), consumed)
				cs.inflight.add()
				go sub.settle(cs, msg, d.DeliveryTag, id, done, deadLetter)
			case <-ctx.Done():
				done() // not handed out: back to the queue when the channel closes
				cs.dups.release(id, false)
				stop()
				return closed, nil
			case <-s.closing:
				done()
				cs.dups.release(id, false)
				stop()
				return closed, nil
			}
		case d, ok := <-commands:
			if !ok {
				stop()
				return closed, errors.New("kill topic listener closed")
			}
			before := sub.mode
			sub.command(d)
			switch {
			case sub.mode == paused:
				stop()
				sub.event("stopped", d, nil)
				sub.answer(d, before, paused, nil)
				return killed, nil
			case sub.mode == draining && before != draining:
				t := time.NewTicker(drainCheck)
				defer t.Stop()
				drainTick = t.C
			}
		case <-drainTick:
			if cs.inflight.n.Load() > 0 {
				continue
			}
			if q, err := inspect(conn, sub.queue); err == nil && q.Messages == 0 {
				stop()
				return drained, nil
			}
		case <-ctx.Done():
			stop()
			return closed, nil
		case <-s.closing:
			stop()
			return closed, nil
		}
	}
}

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

var consumerSeq, subscriptionSeq atomic.Uint64

// stop cancels the consumer and waits, up to ShutdownTimeout, for the messages handed out to
// be settled; their settlements go out together when the acker closes (see acker.hold). What
// was received but not handed out goes back to the queue when the channel closes: nacked
// one by one, it would make the quorum queue's channel stash the settlements that follow.
func (sub *subscription) stop(ch *amqp.Channel, tag string, deliveries <-chan amqp.Delivery, cs *channelState) {
	s := sub.s
	cs.acks.hold()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := amqpx.Do(ctx, ch, func() error { return ch.Cancel(tag, false) }); err == nil {
		for range deliveries { // closed once the broker confirmed the cancel
		}
	}
	done := make(chan struct{})
	go func() { cs.inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.logger.Error("Shutdown timeout: messages still in flight go back to the queue", ctx.Err(),
			watermill.LogFields{"queue": sub.queue, "timeout": s.cfg.ShutdownTimeout})
		cs.hardFn(errShutdownTimeout)
	}
}

// settle acks the delivery once the handler has acked msg (and remembers its publish id, see
// copies), and then ends msg's context. A nacked one goes back to the queue after
// RequeueDelay (at once when the consumer stops), or, if warren.DeadLetter was called, is
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

// errCancelledByBroker is why a session ends whose consumer the broker cancelled.
var errCancelledByBroker = errors.New("the broker cancelled the consumer")

// cancelledByBroker ends a session whose consumer the broker cancelled (basic.cancel) while
// its channel stays open: a queue deleted, a classic queue whose node went down, and from
// RabbitMQ 4.3 a quorum queue's consumer that held a message past its consumer timeout (the
// broker has put that message back in the queue). Nothing more is handed out; the messages
// in flight get up to ShutdownTimeout to finish and are settled on the channel, which the
// broker still takes their settlements on, so that none of them is delivered again (closing
// the channel at once would return every one of them to the queue); what was received but
// not handed out goes back to the queue when the channel closes. It returns errQueueGone if
// the queue no longer exists, and otherwise an error that makes the subscription consume
// again.
func (sub *subscription) cancelledByBroker(conn *amqp.Connection, stop func(), cs *channelState) error {
	sub.s.logger.Info("The broker cancelled the consumer: the messages in flight finish and are settled; it consumes again unless the queue was deleted",
		watermill.LogFields{"queue": sub.queue, "in_flight": cs.inflight.n.Load()})
	stop()
	return sub.goneOr(conn, errCancelledByBroker)
}

// channelLost returns the error of a consume channel that closed: the broker's reason when it
// closed the channel (such as a consumer timeout before RabbitMQ 4.3: 406 PRECONDITION_FAILED,
// "delivery acknowledgement on channel N timed out"), else the connection's loss.
func channelLost(closedBy <-chan *amqp.Error) error {
	select {
	case err, ok := <-closedBy:
		if ok && err != nil {
			return fmt.Errorf("channel closed: %w", err)
		}
	default:
	}
	return errors.New("channel closed")
}

// goneOr returns errQueueGone (wrapping err) if the queue no longer exists, and err otherwise:
// a cancelled consumer, or a queue reported "down or inaccessible", is consumed again.
func (sub *subscription) goneOr(conn *amqp.Connection, err error) error {
	if conn.IsClosed() { // the broker closed it (541 for a queue that is down, say): nothing to ask
		return err
	}
	_, ierr := inspect(conn, sub.queue)
	if amqpx.IsNotFound(ierr) {
		return fmt.Errorf("%w: %v", errQueueGone, err)
	}
	if ierr != nil {
		return fmt.Errorf("%w (and the queue cannot be inspected: %v)", err, ierr)
	}
	return fmt.Errorf("%w; queue %s still exists: consuming again", err, sub.queue)
}
