package consumer

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"
)

type subscription struct {
	s *Subscriber
	// queue is the work queue whose topology the subscription belongs to: its poison queue,
	// kill topic and declaration are queue's. consumed is the queue it consumes: queue, or
	// for a lane of a queue ordered by key (topology.Queue.Lanes), that lane, whose
	// deliveries are handed out one key at a time (see keyGate).
	queue     string
	consumed  string
	ordered   bool
	holds     *laneHolds // a lane's held keys; nil for other queues
	out       chan<- *message.Message
	closeOut  bool          // out is the subscription's own: closed when it ends
	over      chan struct{} // closed when it ends
	ready     chan struct{} // closed once it listens and consumes (or is paused), or has ended
	readyOnce sync.Once
	id        string // in answers to kill commands (kill.Answer.Instance)
	steady    bool   // the session consumed (or listened, paused by a kill)
	// isolated makes the next session consume on consumerconns.Conns.Isolated: a consume of this
	// subscription closed the main connection.
	isolated   bool
	onIsolated bool // the session is on consumerconns.Conns.Isolated

	// Set by the kill topic; they outlive a lost connection.
	mode mode
	last time.Time // of the newest command accepted

	lateness []metric.RecordOption // the attributes of warren.delay.lateness
}

// mode is what a subscription does about its queue.
type mode int

const (
	running  mode = iota
	paused        // killed: consumes nothing until resumed
	draining      // consumes until the queue is empty, then deletes it
)

// outcome is why consume returned without an error.
type outcome int

const (
	closed  outcome = iota // the context ended or the subscriber closed
	killed                 // a stop command: the subscription is paused
	drained                // the queue was empty and the consumer is cancelled
	// returned: a lane of a queue ordered by key had a message to requeue, and closed its
	// channel instead (see keyGate): it consumes again after RequeueDelay.
	returned
)

// errQueueGone ends a subscription whose queue was deleted.
var errQueueGone = errors.New("the queue was deleted")

// errRefused ends a subscription whose consume the broker refuses for good (access refused).
// Only the consume's own refusal: amqp091-go reports a connection cut during its handshake
// (a broker restarting) as a 403 too, and that must be retried.
var errRefused = errors.New("the broker refuses the consumer")

// markReady closes sub.ready, once.
func (sub *subscription) markReady() { sub.readyOnce.Do(func() { close(sub.ready) }) }

// session lasts as long as the subscription's channels on a connection (the main one, or the
// isolated one, see consumerconns.Conns): it listens to the kill topic and consumes the queue as
// the mode says. It returns nil once closed, errQueueGone once the queue is gone, or the error
// that lost a channel or the connection; sub.steady tells whether it got as far as consuming
// (or listening, paused by a kill).
func (sub *subscription) session(ctx context.Context) error {
	s := sub.s
	sub.steady = false
	cc := s.conns.Main
	if sub.isolated {
		cc = s.conns.Isolated
	}
	sub.onIsolated = sub.isolated
	conn, err := s.connectionOn(ctx, cc.Conn)
	if err != nil {
		return err
	}
	commands, stopListening, err := sub.listen(conn)
	if err != nil {
		return err
	}
	defer stopListening()
	if err := sub.recall(ctx, conn); err != nil {
		return err
	}
	for {
		if sub.mode == paused {
			sub.markReady() // listening, paused by a kill
			sub.steady = true
			select {
			case d, ok := <-commands:
				if !ok {
					return errors.New("kill topic listener closed")
				}
				sub.command(d)
			case <-ctx.Done():
				return nil
			case <-s.closing:
				return nil
			}
			continue
		}
		out, err := sub.consume(ctx, cc, conn, commands)
		if err != nil {
			return err
		}
		switch out {
		case closed:
			return nil
		case drained:
			gone, err := sub.awaitDeletion(ctx, conn)
			if err != nil || gone {
				return err
			}
		case returned:
			t := time.NewTimer(s.cfg.RequeueDelay)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-s.closing:
				t.Stop()
				return nil
			}
		}
	}
}
