package consumer

import (
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The acker tests run in a synctest bubble: the acker's linger timer runs on the bubble's
// fake clock, which only moves when every goroutine of the bubble is blocked, so what goes
// into one batch does not depend on the machine's load. synctest.Wait returns once the
// acker's goroutine has done all it can with what it was given.

// frame is one settlement written to the channel.
type frame struct {
	op       string // "ack" or "nack"
	tag      uint64
	multiple bool
	requeue  bool // nack only
}

func ackFrame(tag uint64, multiple bool) frame { return frame{op: "ack", tag: tag, multiple: multiple} }
func nackFrame(tag uint64, requeue bool) frame { return frame{op: "nack", tag: tag, requeue: requeue} }

// fakeSettler records the frames the acker writes, and fails every one with err if set.
// While gate is set and open, every write waits for it to close.
type fakeSettler struct {
	mu     sync.Mutex
	frames []frame
	err    error
	gate   chan struct{}
}

func (f *fakeSettler) Ack(tag uint64, multiple bool) error {
	if f.gate != nil {
		<-f.gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.frames = append(f.frames, ackFrame(tag, multiple))
	return f.err
}

func (f *fakeSettler) Nack(tag uint64, multiple, requeue bool) error {
	if f.gate != nil {
		<-f.gate
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.frames = append(f.frames, frame{op: "nack", tag: tag, multiple: multiple, requeue: requeue})
	return f.err
}

func (f *fakeSettler) written() []frame {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]frame(nil), f.frames...)
}

// Acks for consecutive tags from the lowest unsettled one go out as a single multiple ack,
// whether the batch is cut by its size or by the linger, and whatever order they came in.
func TestAckerCoalescesInOrderAcks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := &fakeSettler{}
		a := newAcker(ch, 16, watermill.NopLogger{}) // a write every 4 settlements
		require.Equal(t, 4, a.target)

		for _, tag := range []uint64{2, 1, 4, 3} { // a full batch: written at once
			a.settle(tag, ack)
		}
		synctest.Wait()
		assert.Equal(t, []frame{ackFrame(4, true)}, ch.written())

		a.settle(5, ack)
		a.settle(6, ack)
		synctest.Wait()
		assert.Equal(t, []frame{ackFrame(4, true)}, ch.written(), "a partial batch waits for the linger")
		time.Sleep(lingerFor) // the bubble's fake clock: the linger ends
		synctest.Wait()
		assert.Equal(t, []frame{ackFrame(4, true), ackFrame(6, true)}, ch.written(), "the linger ended: the batch is written")

		a.close()
		assert.Equal(t, []frame{ackFrame(4, true), ackFrame(6, true)}, ch.written())
		assert.Equal(t, uint64(7), a.next)
		assert.Empty(t, a.settled)
	})
}

// An ack above an unsettled tag waits for the tags below it, and goes out in the multiple ack
// that covers them once they are settled.
func TestAckerCoversOutOfOrderAcksWithALaterRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := &fakeSettler{}
		a := newAcker(ch, 8, watermill.NopLogger{}) // a write every 2 settlements
		require.Equal(t, 2, a.target)

		a.settle(2, ack)
		a.settle(4, ack) // tag 1 is outstanding: no run
		synctest.Wait()
		assert.Empty(t, ch.written(), "acks above a gap wait for it")

		a.settle(1, ack)
		a.settle(3, ack) // 1..4 now settled: one multiple ack
		synctest.Wait()
		assert.Equal(t, []frame{ackFrame(4, true)}, ch.written())
		a.close()
		assert.Equal(t, uint64(5), a.next)
		assert.Empty(t, a.late)
		assert.Empty(t, a.settled)
	})
}

// An ack above a tag that stays unsettled goes out alone once it has waited lateFor; a later
// multiple ack covers the run, skipping the tags acked alone before.
func TestAckerSendsOutOfOrderAcksAloneAfterLateFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := &fakeSettler{}
		a := newAcker(ch, 8, watermill.NopLogger{}) // a write every 2 settlements

		a.settle(2, ack)
		a.settle(4, ack) // tag 1 is outstanding: a slow handler
		synctest.Wait()
		assert.Empty(t, ch.written())
		time.Sleep(lateFor) // the bubble's fake clock: they have waited lateFor
		synctest.Wait()
		singles := ch.written()
		assert.ElementsMatch(t, []frame{ackFrame(2, false), ackFrame(4, false)}, singles)

		a.settle(1, ack)
		a.settle(3, ack) // 1..4 now settled: one multiple ack up to 3 (4 went out already)
		synctest.Wait()
		a.settle(6, ack)
		a.settle(5, ack)
		synctest.Wait()
		a.close()

		assert.Equal(t, []frame{ackFrame(3, true), ackFrame(6, true)}, ch.written()[len(singles):])
		assert.Equal(t, uint64(7), a.next)
		assert.Empty(t, a.settled, "the tags acked alone are forgotten once the run passes them")
	})
}

// Acks still waiting above a gap when the acker closes go out alone: the channel is closing.
func TestAckerCloseSendsTheWaitingAcks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := &fakeSettler{}
		a := newAcker(ch, 1, watermill.NopLogger{}) // every settlement a write of its own
		a.settle(2, ack)
		synctest.Wait()
		assert.Empty(t, ch.written())
		a.close()
		assert.Equal(t, []frame{ackFrame(2, false)}, ch.written())
	})
}

// Requeues and rejects go out one by one, as nacks with and without requeue, and a
// multiple ack after them passes over their tags.
func TestAckerNacksAndRejectsSingly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := &fakeSettler{}
		a := newAcker(ch, 16, watermill.NopLogger{}) // a write every 4 settlements
		a.settle(1, requeue)
		a.settle(2, reject)
		a.settle(3, ack)
		a.settle(5, requeue) // tag 4 outstanding
		synctest.Wait()
		a.settle(4, ack)
		a.close()

		assert.Equal(t, []frame{
			nackFrame(1, true), nackFrame(2, false), nackFrame(5, true), ackFrame(3, true),
			ackFrame(4, true),
		}, ch.written())
		assert.Equal(t, uint64(6), a.next, "the nacked tag 5 is passed over")
		assert.Empty(t, a.settled)
	})
}

// After hold nothing is written; close then writes all of it: the
// nacks, one multiple ack for the run from the lowest unsettled tag and single acks above
// a gap.
func TestAckerHoldsUntilClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := &fakeSettler{}
		a := newAcker(ch, 1, watermill.NopLogger{}) // every settlement a write of its own
		require.Equal(t, 1, a.target)
		a.settle(1, ack)
		synctest.Wait()
		require.Equal(t, []frame{ackFrame(1, true)}, ch.written())

		a.hold()
		a.hold() // twice is harmless
		a.settle(3, ack)
		a.settle(2, ack)
		a.settle(6, requeue)
		a.settle(5, ack)
		a.settle(4, ack)
		a.settle(7, ack)
		a.settle(9, ack) // tag 8 outstanding
		a.settle(10, reject)
		synctest.Wait()
		assert.Equal(t, []frame{ackFrame(1, true)}, ch.written(), "held, not written")

		a.close()
		assert.Equal(t, []frame{
			ackFrame(1, true),
			nackFrame(6, true), nackFrame(10, false), ackFrame(7, true), ackFrame(9, false),
		}, ch.written())
	})
}

// close settles everything asked for before it, also what the acker had not read yet
// because it was busy writing.
func TestAckerCloseSettlesWhatIsQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := &fakeSettler{gate: make(chan struct{})}
		a := newAcker(ch, 1, watermill.NopLogger{}) // every settlement a write of its own
		a.settle(1, ack)
		synctest.Wait() // the acker waits in the write of tag 1
		a.hold()
		for tag := uint64(2); tag <= 40; tag++ {
			a.settle(tag, ack)
		}
		a.settle(42, requeue)
		closed := make(chan struct{})
		go func() {
			defer close(closed)
			a.close()
		}()
		synctest.Wait() // close is waiting for the acker
		close(ch.gate)
		<-closed

		assert.Equal(t, []frame{ackFrame(1, true), nackFrame(42, true), ackFrame(40, true)}, ch.written())
	})
}

// After close, settle neither writes nor blocks, even past the size of the request buffer.
func TestAckerSettleAfterCloseDoesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := &fakeSettler{}
		a := newAcker(ch, 16, watermill.NopLogger{})
		a.settle(1, ack)
		a.close()
		require.Equal(t, []frame{ackFrame(1, true)}, ch.written(), "close writes what was asked before it")

		for tag := uint64(2); tag < uint64(2+2*cap(a.reqs)); tag++ {
			a.settle(tag, ack) // a deadlock here fails the bubble
		}
		a.settle(2, reject)
		synctest.Wait()
		assert.Equal(t, []frame{ackFrame(1, true)}, ch.written())
	})
}

// A channel error is logged once, however many writes fail after it; the writes go on.
func TestAckerLogsChannelErrorOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		closed := errors.New("channel/connection is not open")
		ch := &fakeSettler{err: closed}
		logger := watermill.NewCaptureLogger()
		a := newAcker(ch, 1, logger) // every settlement a write of its own
		a.settle(1, ack)
		a.settle(3, ack)
		a.settle(4, requeue)
		synctest.Wait()
		a.hold()
		a.settle(2, reject)
		a.close()

		assert.Equal(t, []frame{ackFrame(1, true), nackFrame(4, true), nackFrame(2, false), ackFrame(3, true)}, ch.written(),
			"ack 3 waits above the gap at 2: the run through it goes out at close")
		errs := logger.Captured()[watermill.ErrorLogLevel]
		require.Len(t, errs, 1)
		assert.ErrorIs(t, errs[0].Err, closed)
	})
}
