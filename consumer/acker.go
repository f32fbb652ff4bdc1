package consumer

import (
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"
)

// acker settles the deliveries of one channel from a single goroutine. Acks that are waiting
// together for consecutive delivery tags, from the lowest one not yet settled, go out as one
// multiple ack: under load the broker gets a fraction of the ack frames; when idle, an ack
// goes out lingerFor after it was asked for. An ack above a tag not yet settled (its handler finished first among
// concurrent ones) waits up to lateFor for the tags below it, to go out in a later multiple
// ack; after that, it goes out alone: a slower handler holds the acks after it that long at
// most.
//
// Once hold is called (the consumer is stopping and its channel will close), settlements are
// kept and go out together at close, as few frames as they can: a quorum queue's channel
// that has more than 32 commands unapplied stashes the settlements that follow, and drops
// them if the channel closes before it sends them (rabbitmq/rabbitmq-server#10327, seen on
// 3.10.8: messages acked just before a graceful shutdown delivered again).
type acker struct {
	ch      settler
	logger  watermill.LoggerAdapter
	reqs    chan settlement
	holding chan struct{} // closed by hold
	stop    chan struct{}
	done    chan struct{}

	target  int                  // settlements worth one write
	next    uint64               // the lowest delivery tag not settled
	settled map[uint64]bool      // tags above next, settled one by one
	late    map[uint64]time.Time // acks above next not yet sent, and when they came: they wait for the tags below
	failed  bool
}

// settler is what the acker needs of a channel: *amqp.Channel.
type settler interface {
	Ack(tag uint64, multiple bool) error
	Nack(tag uint64, multiple, requeue bool) error
}

var _ settler = (*amqp.Channel)(nil)

type settlement struct {
	tag uint64
	how settleAs
}

// settleAs is how a delivery is settled.
type settleAs int

const (
	ack     settleAs = iota
	requeue          // nack, back to the queue
	reject           // nack without requeue: the queue dead-letters it
)

// lingerFor is how long the acker waits for more settlements before it writes.
const lingerFor = 4 * time.Millisecond

// lateFor is how long an ack above an unsettled tag waits for a multiple ack to cover it.
// Handlers that run concurrently finish in a different order than their deliveries came:
// acked one by one, a quorum queue's consumer sends the broker several times the ack frames
// (measured: docs/decisions.md).
const lateFor = 2 * lingerFor

func newAcker(ch settler, prefetch int, logger watermill.LoggerAdapter) *acker {
	a := &acker{
		ch: ch, logger: logger, target: max(1, prefetch/4),
		reqs: make(chan settlement, 256), holding: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{}),
		next: 1, settled: map[uint64]bool{}, late: map[uint64]time.Time{},
	}
	go a.run()
	return a
}

// settle acks, requeues or rejects the delivery tag. After close it does nothing: the channel
// is closing, and the broker requeues what was not acked.
func (a *acker) settle(tag uint64, how settleAs) {
	select {
	case a.reqs <- settlement{tag, how}:
	case <-a.stop:
	}
}

// hold keeps the settlements asked for from now on, for close to send together.
func (a *acker) hold() {
	select {
	case <-a.holding:
	default:
		close(a.holding)
	}
}

// isHolding reports whether hold was called.
func (a *acker) isHolding() bool {
	select {
	case <-a.holding:
		return true
	default:
		return false
	}
}

// close settles what was asked for so far and stops.
func (a *acker) close() {
	close(a.stop)
	<-a.done
}

func (a *acker) run() {
	defer close(a.done)
	var held []settlement // since hold
	batch := make([]settlement, 0, cap(a.reqs))
	linger := time.NewTimer(time.Hour)
	linger.Stop()
	lateTimer := time.NewTimer(time.Hour)
	lateTimer.Stop()
	for {
		select {
		case <-lateTimer.C:
			a.apply(nil)
		case s := <-a.reqs:
			batch = append(batch[:0], s)
			linger.Reset(lingerFor)
		gather:
			for len(batch) < a.target {
				select {
				case s := <-a.reqs:
					batch = append(batch, s)
				case <-linger.C:
					break gather
				case <-a.stop:
					break gather
				}
			}
			linger.Stop()
			if a.isHolding() {
				held = append(held, batch...)
			} else {
				a.apply(batch)
			}
		case <-a.stop:
			for {
				select {
				case s := <-a.reqs:
					held = append(held, s)
				default:
					a.apply(held)
					a.sendLate(time.Time{})
					return
				}
			}
		}
		if oldest, ok := a.oldestLate(); ok && !a.isHolding() { // once holding, close sends them
			lateTimer.Reset(time.Until(oldest.Add(lateFor)))
		}
	}
}

// apply writes batch: nacks at once, the run of acks from next as one multiple ack; the acks
// above a gap wait in late, and go out alone once they have waited lateFor.
func (a *acker) apply(batch []settlement) {
	now := time.Now()
	for _, s := range batch {
		if s.how == ack {
			a.late[s.tag] = now
			continue
		}
		a.check(a.ch.Nack(s.tag, false, s.how == requeue))
		a.settled[s.tag] = true
	}
	// The run of consecutive tags from next: one multiple ack for all of it (tags in the
	// run settled before are no longer outstanding, and a multiple ack skips them).
	var last uint64
	for {
		if _, ok := a.late[a.next]; ok {
			delete(a.late, a.next)
			last = a.next
		} else if a.settled[a.next] {
			delete(a.settled, a.next)
		} else {
			break
		}
		a.next++
	}
	if last != 0 {
		a.check(a.ch.Ack(last, true))
	}
	a.sendLate(now.Add(-lateFor))
}

// sendLate acks alone each ack waiting above a gap since before (all of them with the zero
// time).
func (a *acker) sendLate(before time.Time) {
	for tag, at := range a.late {
		if before.IsZero() || !at.After(before) {
			a.check(a.ch.Ack(tag, false))
			a.settled[tag] = true
			delete(a.late, tag)
		}
	}
}

// oldestLate returns when the oldest ack waiting above a gap came, if one waits.
func (a *acker) oldestLate() (oldest time.Time, ok bool) {
	for _, at := range a.late {
		if !ok || at.Before(oldest) {
			oldest, ok = at, true
		}
	}
	return oldest, ok
}

func (a *acker) check(err error) {
	if err != nil && !a.failed {
		a.failed = true // once per channel: it is closed
		a.logger.Error("Cannot settle messages: the broker will deliver them again", err, nil)
	}
}
