package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/consumerconns"
	"github.com/warrenmq/warren/internal/contract"
)

// consume consumes the queue on a channel of its own of conn, cc's connection, until closed,
// killed or drained, or until an error: the channel or connection is lost, or the queue is
// deleted (errQueueGone).
func (sub *subscription) consume(ctx context.Context, cc *consumerconns.Conn, conn *amqp.Connection, commands <-chan amqp.Delivery) (outcome, error) {
	ch, err := conn.Channel()
	if err != nil {
		return closed, err
	}
	defer ch.Close()
	l, err := sub.startConsumer(cc, conn, ch)
	if err != nil {
		return closed, err
	}
	sub.markReady()
	sub.steady = true

	l.ctx, l.commands = ctx, commands
	l.cs = sub.newChannelState(ch)
	defer l.cs.acks.close()
	if l.cs.gate != nil {
		defer l.cs.gate.drop()
	}
	defer func() { // the session's context goes once its last message is settled
		go func() {
			l.cs.inflight.Wait()
			l.cs.hardFn(context.Canceled)
		}()
	}()
	defer l.stopDrainCheck()
	if sub.ordered {
		sub.holds.active.Store(false)
		sub.watchHolds(l.cs)
	}
	if sub.mode == draining {
		l.startDrainCheck()
	}
	return l.run()
}

// consumeLoop is one consumer of the subscription's queue, on a channel of its own, and the
// event sources its loop (run) waits on: deliveries (taken only with a handler slot free),
// the broker's cancel, kill commands, the drain check, the context and closing.
type consumeLoop struct {
	sub        *subscription
	ctx        context.Context
	conn       *amqp.Connection
	ch         *amqp.Channel
	tag        string
	deliveries <-chan amqp.Delivery
	cancelled  <-chan string
	closedBy   <-chan *amqp.Error
	commands   <-chan amqp.Delivery
	cs         *channelState
	drain      *time.Ticker // while draining: when to look whether the queue is empty
	drainTick  <-chan time.Time
	slot       bool // a handler slot is held for the next delivery
}

// startConsumer sets the prefetch of ch, a channel of conn, cc's connection, and consumes the
// queue on it. A consume refused with a connection error on the main connection makes the
// next session consume on the isolated one (see consumerconns.Conns); one refused for good
// returns errRefused, one refused because the queue is gone errQueueGone.
func (sub *subscription) startConsumer(cc *consumerconns.Conn, conn *amqp.Connection, ch *amqp.Channel) (*consumeLoop, error) {
	s := sub.s
	if err := ch.Qos(s.cfg.Prefetch, 0, false); err != nil {
		return nil, err
	}
	l := &consumeLoop{sub: sub, conn: conn, ch: ch}
	l.cancelled = ch.NotifyCancel(make(chan string, 1))
	l.closedBy = ch.NotifyClose(make(chan *amqp.Error, 1))
	l.tag = fmt.Sprintf("warren-%s-%d", s.cfg.HandlerName, consumerSeq.Add(1))
	cc.Consuming.Lock() // one at a time: a refusal that closes conn is this consume's (see consumerconns.Conns)
	deliveries, err := ch.Consume(sub.consumed, l.tag, false, false, false, false, nil)
	cc.Consuming.Unlock()
	if closesConnection(err) && cc == s.conns.Main {
		sub.isolated = true
		// The failure itself is logged once, by run.
		s.logger.Info("Consumer refused with a connection error: it retries on a connection of its own until it is served",
			watermill.LogFields{"queue": sub.queue})
	}
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code != amqp.NotFound && amqpx.IsPermanentBrokerError(err) {
		return nil, fmt.Errorf("%w: %v", errRefused, err)
	}
	if err != nil {
		return nil, sub.goneOr(conn, err)
	}
	l.deliveries = deliveries
	return l, nil
}

// newGate returns the key gate of a lane of a queue ordered by key, nil for other queues.
func (sub *subscription) newGate() *keyGate {
	if !sub.ordered {
		return nil
	}
	return newKeyGate()
}

// newChannelState returns the state of a new consume session on ch (see channelState).
func (sub *subscription) newChannelState(ch *amqp.Channel) *channelState {
	s := sub.s
	cs := &channelState{
		gate:     sub.newGate(),
		acks:     newAcker(ch, s.cfg.Prefetch, s.logger),
		dups:     &copies{seen: &s.seen, live: map[uint64]int{}},
		stopping: make(chan struct{}),
		slots:    make(chan struct{}, s.cfg.Concurrency),
	}
	cs.hardStop, cs.hardFn = context.WithCancelCause(s.hardStop)
	return cs
}

// run waits for the next event of any source and hands it to its step, until a step ends the
// consumer. A delivery is taken only with a free slot: at most Concurrency are handed out, the
// rest of the prefetch waits, and commands, closing and the context are still heard.
func (l *consumeLoop) run() (outcome, error) {
	var wake, returning <-chan struct{}
	if l.cs.gate != nil {
		wake, returning = l.cs.gate.wake, l.cs.gate.returning
	}
	for {
		if !l.slot { // a free slot is taken at once, without waiting on every source
			select {
			case l.cs.slots <- struct{}{}:
				l.slot = true
			default:
			}
		}
		if l.slot && l.cs.gate != nil { // a message whose key's turn came goes before new deliveries
			if h := l.cs.gate.next(); h != nil {
				if end, out, err := l.handOut(h); end {
					return out, err
				}
				continue
			}
		}
		in, take := l.deliveries, (chan<- struct{})(nil)
		if !l.slot {
			in, take = nil, l.cs.slots
		}
		var (
			end bool
			out outcome
			err error
		)
		select {
		case take <- struct{}{}:
			l.slot = true
		case <-wake: // the top of the loop hands it out
		case <-returning:
			l.stop()
			return returned, nil
		case _, sent := <-l.cancelled:
			end, out, err = l.onCancel(sent)
		case d, ok := <-in:
			end, out, err = l.onDelivery(d, ok)
		case d, ok := <-l.commands:
			end, out, err = l.onCommand(d, ok)
		case <-l.drainTick:
			end, out, err = l.onDrainCheck()
		case <-l.ctx.Done():
			end, out, err = l.halt()
		case <-l.sub.s.closing:
			end, out, err = l.halt()
		}
		if end {
			return out, err
		}
	}
}

// stop stops the consumer (see subscription.stop); what is stopping hears it first.
func (l *consumeLoop) stop() {
	close(l.cs.stopping)
	l.sub.stop(l.ch, l.tag, l.deliveries, l.cs)
}

// halt stops the consumer because the context ended or the subscriber closed.
func (l *consumeLoop) halt() (bool, outcome, error) {
	l.stop()
	return true, closed, nil
}

// onCancel handles what the broker's cancel notification channel gave: a cancel that was sent
// ends the consumer (see cancelledByBroker); the channel closed, not sent to, when the
// channel closes, and the deliveries end too.
func (l *consumeLoop) onCancel(sent bool) (bool, outcome, error) {
	if !sent {
		l.cancelled = nil
		return false, closed, nil
	}
	return true, closed, l.sub.cancelledByBroker(l.conn, l.stop, l.cs)
}

// onDelivery hands d out, or, when the deliveries ended, ends the consumer: cancelled by the
// broker if it says so, else with the channel's loss. A copy of a message handled already is
// acked at once; one that cannot be made a message is poisoned (see message). One not handed
// out because the context ended or the subscriber closed goes back to the queue when the
// channel closes.
func (l *consumeLoop) onDelivery(d amqp.Delivery, ok bool) (bool, outcome, error) {
	sub, s, cs := l.sub, l.sub.s, l.cs
	if !ok {
		select {
		case _, sent := <-l.cancelled:
			if sent {
				return true, closed, sub.cancelledByBroker(l.conn, l.stop, cs)
			}
		default:
		}
		close(cs.stopping)
		return true, closed, channelLost(l.closedBy)
	}
	if sub.ordered && !sub.holds.active.Load() { // the lane's consumer is active: its holds are written
		if err := sub.loadHolds(); err != nil {
			l.stop()
			return true, closed, fmt.Errorf("read the held keys: %w", err)
		}
		sub.holds.active.Store(true)
	}
	sub.recordLateness(d)
	id, _ := d.Headers[contract.PublishIDHeader].(string)
	if !cs.dups.claim(id) {
		s.logger.Info("Copy of a message handled already: acked", watermill.LogFields{"queue": sub.queue, "message_id": d.MessageId})
		cs.acks.settle(d.DeliveryTag, ack)
		sub.settledUnhanded(d)
		return false, closed, nil
	}
	h := sub.message(d, id, cs)
	if h == nil {
		cs.dups.release(id, false) // poisoned, or put back: never taken for done
		sub.settledUnhanded(d)
		return false, closed, nil
	}
	if h.key != "" && !cs.gate.admit(h) {
		return false, closed, nil // waits behind its key; the slot stays for the next delivery
	}
	return l.handOut(h)
}

// settledUnhanded is told that d was settled without being handed out: a held message moved
// back (see laneHolds) has the next one moved.
func (sub *subscription) settledUnhanded(d amqp.Delivery) {
	if _, marked := d.Headers[contract.ReleasedHeader]; marked && sub.ordered {
		key, _ := d.Headers[warren.MetadataOrderKey].(string)
		sub.holds.movedSettled(key)
	}
}

// handOut hands h out to the subscription's receiver, holding a slot, and counts it in
// flight; when the context ends or the subscriber closes first, it stops the consumer (h goes
// back to the queue when the channel closes).
func (l *consumeLoop) handOut(h *handout) (bool, outcome, error) {
	sub, s, cs := l.sub, l.sub.s, l.cs
	consumed := s.consumes.Get(sub.queue, h.Delivery.Exchange)
	cs.inflight.add() // before the receiver can settle it
	if h.key != "" && sub.holds.parks(h) {
		l.slot = false // settling frees it
		go sub.park(h)
		return false, closed, nil
	}
	select {
	case sub.out <- h.msg:
		l.slot = false // settling frees it
		s.metrics.Consumed(context.Background(), consumed)
		if h.Settler == nil {
			go h.await()
		}
		return false, closed, nil
	case <-l.ctx.Done():
	case <-s.closing:
	}
	cs.inflight.done()
	h.done() // not handed out: back to the queue when the channel closes
	cs.dups.release(h.id, false)
	l.stop()
	return true, closed, nil
}

// onCommand applies a kill command (see command): a stop ends the consumer, paused, and is
// reported and answered once stopped; a delete starts the drain check. The commands ending
// ends the consumer with an error.
func (l *consumeLoop) onCommand(d amqp.Delivery, ok bool) (bool, outcome, error) {
	sub := l.sub
	if !ok {
		l.stop()
		return true, closed, errors.New("kill topic listener closed")
	}
	before := sub.mode
	sub.command(d)
	switch {
	case sub.mode == paused:
		l.stop()
		sub.event("stopped", d, nil)
		sub.answer(d, before, paused, nil)
		return true, killed, nil
	case sub.mode == draining && before != draining:
		l.startDrainCheck()
	}
	return false, closed, nil
}

// onDrainCheck ends the consumer, drained, once nothing is in flight and the queue is empty.
func (l *consumeLoop) onDrainCheck() (bool, outcome, error) {
	if l.cs.inflight.n.Load() > 0 {
		return false, closed, nil
	}
	if q, err := inspect(l.conn, l.sub.consumed); err == nil && q.Messages == 0 {
		l.stop()
		return true, drained, nil
	}
	return false, closed, nil
}

// startDrainCheck looks whether the queue is empty every drainCheck from now on.
func (l *consumeLoop) startDrainCheck() {
	l.stopDrainCheck()
	l.drain = time.NewTicker(drainCheck)
	l.drainTick = l.drain.C
}

func (l *consumeLoop) stopDrainCheck() {
	if l.drain != nil {
		l.drain.Stop()
	}
}

var consumerSeq, subscriptionSeq atomic.Uint64

// stop cancels the consumer and waits, up to ShutdownTimeout, for the messages handed out to
// be settled; their settlements go out together when the acker closes (see acker.hold). What
// was received but not handed out goes back to the queue when the channel closes: nacked
// one by one, it would make the quorum queue's channel stash the settlements that follow.
//
// A lane of a queue ordered by key is not cancelled: the broker would make the next of its
// single active consumers active at once, which would take the lane's next messages while the
// ones of the same keys received here are still to go back. The consumer stays active, takes
// nothing more, and its channel's close returns all it had not settled, before the next one
// gets anything.
func (sub *subscription) stop(ch *amqp.Channel, tag string, deliveries <-chan amqp.Delivery, cs *channelState) {
	s := sub.s
	cs.acks.hold()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if !sub.ordered {
		if err := amqpx.Do(ctx, ch, func() error { return ch.Cancel(tag, false) }); err == nil {
			for range deliveries { // closed once the broker confirmed the cancel
			}
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
	_, ierr := inspect(conn, sub.consumed)
	if amqpx.IsNotFound(ierr) {
		return fmt.Errorf("%w: %v", errQueueGone, err)
	}
	if ierr != nil {
		return fmt.Errorf("%w (and the queue cannot be inspected: %v)", err, ierr)
	}
	return fmt.Errorf("%w; queue %s still exists: consuming again", err, sub.consumed)
}
