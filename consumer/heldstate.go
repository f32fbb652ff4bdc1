package consumer

import (
	"context"
	"slices"
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
//
// It also watches the state for the lanes of the queue that this process consumes (see watch).
// Its fields are guarded by the Subscriber's heldMu.
type heldState struct {
	pending []*heldOp // the reads and writes waiting for the next batch
	running bool      // a batch is out: the next one waits for it
	sent    time.Time // when the last batch ended: the next waits until holdsYield after

	lanes map[*subscription]*laneWatch // the lanes watched
	stop  chan struct{}                // closed when the last of them is gone; nil with none
}

// heldStateOf returns the process's heldState of queue; the caller holds heldMu.
func (s *Subscriber) heldStateOf(queue string) *heldState {
	hs := s.heldStates[queue]
	if hs == nil {
		hs = &heldState{lanes: map[*subscription]*laneWatch{}}
		if s.heldStates == nil {
			s.heldStates = map[string]*heldState{}
		}
		s.heldStates[queue] = hs
	}
	return hs
}

// heldOp is a read (change nil) or a write of a queue's held state waiting its turn.
type heldOp struct {
	change func(*held.State) bool
	st     held.State
	err    error
	done   chan struct{} // closed once st and err are set
	lead   chan struct{} // closed when its caller is to send the next batch
}

// holdsYield is how long a process leaves the held state's lock free after a batch before
// it takes it for the next one. The lock (statequeue.Lock) goes to whoever asks first while it
// is free, and the processes waiting for it ask again every 50 ms or so (75 ms at most:
// statequeue.Lock's backoff), while the holder, its next batch waiting, would ask a few
// milliseconds after letting it go: on a busy machine it won batch after batch, and the
// others waited up to 4 s for one take (docs/decisions.md). Free for longer than a waiter's
// longest pause, the lock goes to a waiter; the holder's next batch carries all that came
// meanwhile.
const holdsYield = 100 * time.Millisecond

// updateHolds reads queue's held state and, when change reports a change, writes the changed
// state (see held.Update), in the next batch of this process's reads and writes of it: one
// that begins after the call. It returns the state as the batch left it.
func (s *Subscriber) updateHolds(queue string, change func(*held.State) bool) (held.State, error) {
	return s.awaitHolds(queue, s.queueHolds(queue, change))
}

// queueHolds puts a read or write of queue's held state in line for the next batch, after
// those queued before it (a batch applies its changes in their order); awaitHolds waits for
// its outcome.
func (s *Subscriber) queueHolds(queue string, change func(*held.State) bool) *heldOp {
	op := &heldOp{change: change, done: make(chan struct{}), lead: make(chan struct{})}
	s.heldMu.Lock()
	hs := s.heldStateOf(queue)
	hs.pending = append(hs.pending, op)
	if !hs.running {
		hs.running = true
		close(op.lead)
	}
	s.heldMu.Unlock()
	return op
}

// awaitHolds returns the state as the batch of op, queued by queueHolds, left it; the first
// op of a batch sends it.
func (s *Subscriber) awaitHolds(queue string, op *heldOp) (held.State, error) {
	s.heldMu.Lock()
	hs := s.heldStateOf(queue)
	s.heldMu.Unlock()
	select {
	case <-op.done:
	case <-op.lead: // send the batch, this op in it, then hand the turn on
		s.heldMu.Lock()
		wait := time.Until(hs.sent.Add(holdsYield))
		s.heldMu.Unlock()
		if wait > 0 { // what comes meanwhile joins the batch
			time.Sleep(wait)
		}
		s.heldMu.Lock()
		batch := hs.pending
		hs.pending = nil
		s.heldMu.Unlock()
		s.sendHolds(queue, batch)
		s.heldMu.Lock()
		hs.sent = time.Now()
		if len(hs.pending) > 0 {
			close(hs.pending[0].lead)
		} else {
			hs.running = false
		}
		s.heldMu.Unlock()
	}
	return op.st, op.err
}

// sendHolds carries out batch in one held.Update, its changes in their order, and tells each
// op the outcome.
func (s *Subscriber) sendHolds(queue string, batch []*heldOp) {
	var change func(*held.State) bool // nil when the batch only reads
	if slices.ContainsFunc(batch, func(op *heldOp) bool { return op.change != nil }) {
		change = func(st *held.State) bool {
			changed := false
			for _, op := range batch {
				if op.change != nil && op.change(st) {
					changed = true
				}
			}
			return changed
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

// watch reads the held state of a queue ordered by key every holdsWatch for the lanes of it
// that this process consumes, once for all of them, and hands it to each lane that needs it:
// one with held keys, for an operator's action on them, and one not active yet or idle since
// it became so (a lane taken over holds the keys the previous consumer held, and
// their actions are to be carried out even while no message comes; the first delivery reads
// them again). Each read takes the state's lock, which the lanes of every process share; a
// read of the state writes it (see statequeue.Settle). An idle lane without held keys is read
// for less and less often, up to every holdsIdleMax. It starts a pass in a lane whose held key
// an operator acted on, and runs until the queue's last watched lane is gone.
func (s *Subscriber) watch(hs *heldState, stop <-chan struct{}, queue string) {
	t := time.NewTicker(holdsWatch)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-stop:
			return
		}
		due := map[*subscription]int64{} // the lanes to load, with their view's count before the read
		s.heldMu.Lock()
		now := time.Now()
		for sub, lw := range hs.lanes {
			lh := sub.holds
			lh.mu.Lock()
			n, seq := len(lh.keys), lh.seq
			lh.mu.Unlock()
			idle := !lh.active.Load() && !now.Before(lw.loadAt)
			if idle {
				lw.loadAt, lw.loadEvery = now.Add(lw.loadEvery), min(2*lw.loadEvery, holdsIdleMax)
			}
			if n > 0 || idle {
				due[sub] = seq
			}
		}
		s.heldMu.Unlock()
		if len(due) == 0 {
			continue
		}
		st, err := s.updateHolds(queue, nil)
		if err != nil {
			s.logger.Debug("Held keys not read", watermill.LogFields{"queue": queue, "err": err.Error()})
			continue
		}
		s.heldMu.Lock()
		for sub, seq := range due {
			if lw := hs.lanes[sub]; lw != nil { // still watched
				sub.applyHolds(st, seq, false)
				sub.passIfActed(lw.cs)
			}
		}
		s.heldMu.Unlock()
	}
}

// laneWatch is a lane that watch watches.
type laneWatch struct {
	cs        *channelState
	loadEvery time.Duration // an idle lane's pause between loads
	loadAt    time.Time     // an idle lane's next load
}

// watchHolds has the process's watch of sub's queue watch its lane until cs stops. It is
// called from the subscription, which the Subscriber's subs counts.
func (sub *subscription) watchHolds(cs *channelState) {
	s := sub.s
	s.heldMu.Lock()
	hs := s.heldStateOf(sub.queue)
	if hs.stop == nil {
		stop := make(chan struct{})
		hs.stop = stop
		s.subs.Add(1)
		go func() {
			defer s.subs.Done()
			s.watch(hs, stop, sub.queue)
		}()
	}
	hs.lanes[sub] = &laneWatch{cs: cs, loadEvery: holdsWatch, loadAt: time.Now()}
	s.heldMu.Unlock()
	go func() {
		<-cs.stopping
		s.heldMu.Lock()
		defer s.heldMu.Unlock()
		delete(hs.lanes, sub)
		if len(hs.lanes) == 0 {
			close(hs.stop)
			hs.stop = nil
		}
	}()
}
