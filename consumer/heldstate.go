package consumer

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/held"
)

// heldState is this process's way to the held state of one queue ordered by key (package
// held): its lanes' reads and writes wait their turn and go to the broker together, one
// batch at a time, under one take of the state's lock. The lock is the queue's, shared by the
// lanes of every process, and each take of it is a few round trips to a quorum queue: with
// a take per read and per write, a poisoned key every tenth of a second kept lanes that a
// process had just taken waiting seconds for their first read (docs/decisions.md).
type heldState struct {
	pending []*heldOp // guarded by the Subscriber's watchMu
	running bool      // a batch is out: the next one waits for it
}

// heldOp is a read (change nil) or a write of a queue's held state waiting its turn.
type heldOp struct {
	change func(*held.State) bool
	st     held.State
	err    error
	done   chan struct{} // closed once st and err are set
	lead   chan struct{} // closed when its caller is to send the next batch
}

// updateHolds reads queue's held state and, when change reports a change, writes the changed
// state (see held.Update), in the next batch of this process's reads and writes of it: one
// that begins after the call. It returns the state as the batch left it.
func (s *Subscriber) updateHolds(queue string, change func(*held.State) bool) (held.State, error) {
	op := &heldOp{change: change, done: make(chan struct{}), lead: make(chan struct{})}
	s.watchMu.Lock()
	hs := s.heldStates[queue]
	if hs == nil {
		hs = &heldState{}
		if s.heldStates == nil {
			s.heldStates = map[string]*heldState{}
		}
		s.heldStates[queue] = hs
	}
	hs.pending = append(hs.pending, op)
	if !hs.running {
		hs.running = true
		close(op.lead)
	}
	s.watchMu.Unlock()
	select {
	case <-op.done:
	case <-op.lead: // send the batch, this op in it, then hand the turn on
		s.watchMu.Lock()
		batch := hs.pending
		hs.pending = nil
		s.watchMu.Unlock()
		s.sendHolds(queue, batch)
		s.watchMu.Lock()
		if len(hs.pending) > 0 {
			close(hs.pending[0].lead)
		} else {
			hs.running = false
		}
		s.watchMu.Unlock()
	}
	return op.st, op.err
}

// sendHolds carries out batch in one held.Update, its changes in their order, and tells each
// op the outcome.
func (s *Subscriber) sendHolds(queue string, batch []*heldOp) {
	var change func(*held.State) bool // nil when the batch only reads
	for _, op := range batch {
		if op.change != nil {
			change = func(st *held.State) bool {
				changed := false
				for _, op := range batch {
					if op.change != nil && op.change(st) {
						changed = true
					}
				}
				return changed
			}
			break
		}
	}
	var st held.State
	err := s.onHolds(func(ctx context.Context, conn *amqp.Connection) (err error) {
		st, err = held.Update(ctx, conn, queue, change)
		return err
	})
	for _, op := range batch {
		op.st, op.err = st, err
		close(op.done)
	}
}

// holdsWatcher reads the held state of a queue ordered by key every holdsWatch for the lanes
// of it that this process consumes, once for all of them, and hands it to each lane that
// needs it: one with held keys, for an operator's action on them, and one not active yet or
// idle since it became so (a lane taken over holds the keys the previous consumer held, and
// their actions are to be carried out even while no message comes; the first delivery reads
// them again). Each read takes the state's lock, which the lanes of every process share; a
// read of the state writes it (see statequeue.Settle). An idle lane without held keys is read
// for less and less often, up to every holdsIdleMax.
type holdsWatcher struct {
	lanes map[*subscription]*laneWatch // guarded by the Subscriber's watchMu
	stop  chan struct{}                // closed when its last lane is gone
}

// laneWatch is a lane a holdsWatcher watches.
type laneWatch struct {
	cs        *channelState
	loadEvery time.Duration // an idle lane's pause between loads
	loadAt    time.Time     // an idle lane's next load
}

// watchHolds has the process's watcher of sub's queue watch its lane until cs stops. It is
// called from the subscription, which the Subscriber's subs counts.
func (sub *subscription) watchHolds(cs *channelState) {
	s := sub.s
	s.watchMu.Lock()
	w := s.watchers[sub.queue]
	if w == nil {
		w = &holdsWatcher{lanes: map[*subscription]*laneWatch{}, stop: make(chan struct{})}
		if s.watchers == nil {
			s.watchers = map[string]*holdsWatcher{}
		}
		s.watchers[sub.queue] = w
		s.subs.Add(1)
		go func() {
			defer s.subs.Done()
			s.watch(w, sub.queue)
		}()
	}
	w.lanes[sub] = &laneWatch{cs: cs, loadEvery: holdsWatch, loadAt: time.Now()}
	s.watchMu.Unlock()
	go func() {
		<-cs.stopping
		s.watchMu.Lock()
		defer s.watchMu.Unlock()
		delete(w.lanes, sub)
		if len(w.lanes) == 0 {
			delete(s.watchers, sub.queue)
			close(w.stop)
		}
	}()
}

// watch reads queue's held state every holdsWatch for w's lanes that need it (see
// holdsWatcher), until w stops, and starts a pass in a lane whose held key an operator acted
// on.
func (s *Subscriber) watch(w *holdsWatcher, queue string) {
	t := time.NewTicker(holdsWatch)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-w.stop:
			return
		}
		due := map[*subscription]int64{} // the lanes to load, with their view's count before the read
		s.watchMu.Lock()
		now := time.Now()
		for sub, lw := range w.lanes {
			hs := sub.holds
			hs.mu.Lock()
			n, seq := len(hs.keys), hs.seq
			hs.mu.Unlock()
			idle := !hs.active.Load() && !now.Before(lw.loadAt)
			if idle {
				lw.loadAt, lw.loadEvery = now.Add(lw.loadEvery), min(2*lw.loadEvery, holdsIdleMax)
			}
			if n > 0 || idle {
				due[sub] = seq
			}
		}
		s.watchMu.Unlock()
		if len(due) == 0 {
			continue
		}
		st, err := s.updateHolds(queue, nil)
		if err != nil {
			s.logger.Debug("Held keys not read", watermill.LogFields{"queue": queue, "err": err.Error()})
			continue
		}
		s.watchMu.Lock()
		for sub, seq := range due {
			if lw := w.lanes[sub]; lw != nil { // still watched
				sub.applyHolds(st, seq, false)
				sub.passIfActed(lw.cs)
			}
		}
		s.watchMu.Unlock()
	}
}
