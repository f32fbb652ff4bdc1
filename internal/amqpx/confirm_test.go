package amqpx

import (
	"errors"
	"testing"
	"testing/synctest"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// confirmerRun is a Confirmer without a channel, whose run reads channels of the test's
// own, as it reads amqp091's. The tests run in a synctest bubble: synctest.Wait returns once
// run has handled all it was given, and a wait that could never end fails the test.
type confirmerRun struct {
	c        *Confirmer
	confirms chan amqp.Confirmation
	returns  chan amqp.Return
	closes   chan *amqp.Error
	shut     bool
}

// newConfirmerRun returns a confirmerRun whose run is not started yet.
func newConfirmerRun(t *testing.T) *confirmerRun {
	r := &confirmerRun{
		c:        newConfirmer(nil),
		confirms: make(chan amqp.Confirmation, 1024), // buffered as NewConfirmer's
		returns:  make(chan amqp.Return, 64),
		closes:   make(chan *amqp.Error, 1),
	}
	t.Cleanup(func() { r.shutdown(nil) })
	return r
}

func (r *confirmerRun) start() {
	go r.c.run(r.confirms, r.returns, r.closes)
}

func startConfirmer(t *testing.T) *confirmerRun {
	r := newConfirmerRun(t)
	r.start()
	return r
}

// publish registers a publishing in flight as Confirmer.Publish does before it sends the
// frame, and returns it with its delivery tag.
func (r *confirmerRun) publish(exchange, key string, mandatory bool, messageID string) (*Inflight, uint64) {
	c := r.c
	f := &Inflight{key: returnKey{exchange, key, messageID, ""}, done: make(chan struct{})}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	c.pending[c.seq] = f
	if mandatory {
		c.addUnreturned(f)
	}
	return f, c.seq
}

// ack, nack and ret hand over what amqp091's reader would.
func (r *confirmerRun) ack(tag uint64) {
	r.confirms <- amqp.Confirmation{DeliveryTag: tag, Ack: true}
}

func (r *confirmerRun) nack(tag uint64) {
	r.confirms <- amqp.Confirmation{DeliveryTag: tag, Ack: false}
}

func (r *confirmerRun) ret(exchange, key, messageID string) {
	r.returns <- amqp.Return{Exchange: exchange, RoutingKey: key, MessageId: messageID, ReplyCode: 312, ReplyText: "NO_ROUTE"}
}

// shutdown closes the channels as amqp091 does when the channel closes (the error, if any,
// to the close listeners, then closes, returns and confirms closed) and waits for run to end.
func (r *confirmerRun) shutdown(e *amqp.Error) {
	if r.shut {
		return
	}
	r.shut = true
	if e != nil {
		r.closes <- e
	}
	close(r.closes)
	close(r.returns)
	close(r.confirms)
	<-r.c.Done()
}

// resolved returns f's result, which must be there.
func resolved(t *testing.T, f *Inflight) error {
	t.Helper()
	synctest.Wait()
	select {
	case <-f.done:
		return f.err
	default:
		require.FailNow(t, "the publishing is not resolved")
		return nil
	}
}

// unresolved checks that f has no result yet.
func unresolved(t *testing.T, f *Inflight) {
	t.Helper()
	synctest.Wait()
	select {
	case <-f.done:
		assert.Fail(t, "the publishing is resolved too early")
	default:
	}
}

func TestConfirmerAckAndNack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := startConfirmer(t)
		f1, tag1 := r.publish("orders", "created", true, "m1")
		f2, tag2 := r.publish("orders", "created", false, "m2")
		unresolved(t, f1)

		r.nack(tag2) // confirmations may come in any order
		r.ack(tag1)
		assert.NoError(t, resolved(t, f1))
		assert.ErrorIs(t, resolved(t, f2), ErrNacked)

		r.c.mu.Lock()
		defer r.c.mu.Unlock()
		assert.Empty(t, r.c.pending)
		assert.Empty(t, r.c.unreturned, "a confirmed publishing can no longer be returned")
	})
}

// A return resolves nothing by itself; the confirmation after it resolves the publishing
// to a *ReturnedError that says what was returned and why.
func TestConfirmerReturnBeforeAck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := startConfirmer(t)
		f, tag := r.publish("orders", "created", true, "m1")
		r.ret("orders", "created", "m1")
		unresolved(t, f)

		r.ack(tag)
		err := resolved(t, f)
		var ret *ReturnedError
		require.ErrorAs(t, err, &ret)
		assert.Equal(t, ReturnedError{Exchange: "orders", RoutingKey: "created", ReplyCode: 312, ReplyText: "NO_ROUTE"}, *ret)
	})
}

// A return carries no delivery tag: of mandatory publishings with the same exchange,
// routing key and message id, it belongs to the oldest that is neither confirmed nor
// returned.
func TestConfirmerReturnGoesToTheOldestOfTheSameKey(t *testing.T) {
	t.Run("first returned", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := startConfirmer(t)
			f1, tag1 := r.publish("orders", "created", true, "m")
			f2, tag2 := r.publish("orders", "created", true, "m")
			r.ret("orders", "created", "m")
			r.ack(tag1)
			r.ack(tag2)
			var ret *ReturnedError
			assert.ErrorAs(t, resolved(t, f1), &ret)
			assert.NoError(t, resolved(t, f2))
		})
	})
	t.Run("second returned", func(t *testing.T) {
		// The broker confirms the first before it returns the second: the first's
		// confirmation takes it off the list, and the return goes to the second.
		synctest.Test(t, func(t *testing.T) {
			r := startConfirmer(t)
			f1, tag1 := r.publish("orders", "created", true, "m")
			f2, tag2 := r.publish("orders", "created", true, "m")
			r.ack(tag1)
			assert.NoError(t, resolved(t, f1))
			r.ret("orders", "created", "m")
			r.ack(tag2)
			var ret *ReturnedError
			assert.ErrorAs(t, resolved(t, f2), &ret)
		})
	})
	t.Run("both returned", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := startConfirmer(t)
			f1, tag1 := r.publish("orders", "created", true, "m")
			f2, tag2 := r.publish("orders", "created", true, "m")
			r.ret("orders", "created", "m")
			r.ret("orders", "created", "m")
			r.ack(tag1)
			r.ack(tag2)
			var ret *ReturnedError
			assert.ErrorAs(t, resolved(t, f1), &ret)
			assert.ErrorAs(t, resolved(t, f2), &ret)
		})
	})
}

// A return that matches no mandatory publishing in flight (another exchange, routing key,
// message id or correlation id, or a publishing that was not mandatory) is ignored, as is a
// confirmation of an unknown delivery tag.
func TestConfirmerIgnoresUnknownReturnsAndTags(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := startConfirmer(t)
		f1, tag1 := r.publish("orders", "created", true, "m1")
		f2, tag2 := r.publish("orders", "paid", false, "m2")
		r.ret("orders", "created", "other")
		r.ret("billing", "created", "m1")
		r.ret("orders", "deleted", "m1")
		r.returns <- amqp.Return{Exchange: "orders", RoutingKey: "created", MessageId: "m1", CorrelationId: "c1"}
		r.ret("orders", "paid", "m2") // not mandatory: never on the list
		r.ack(99)
		unresolved(t, f1)
		unresolved(t, f2)

		r.ack(tag1)
		r.ack(tag2)
		assert.NoError(t, resolved(t, f1))
		assert.NoError(t, resolved(t, f2))
	})
}

// When the channel closes, every publishing in flight fails with the channel's error, and
// Closed reports it; confirmations lost with the channel cannot resolve anything any more.
func TestConfirmerChannelCloseFailsEverythingPending(t *testing.T) {
	t.Run("with an error", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := startConfirmer(t)
			f1, tag1 := r.publish("orders", "created", true, "m1")
			f2, _ := r.publish("orders", "created", true, "m2")
			f3, _ := r.publish("orders", "paid", false, "m3")
			r.ack(tag1)
			assert.NoError(t, resolved(t, f1))
			assert.NoError(t, r.c.Closed(), "open")

			e := &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - inequivalent arg"}
			r.shutdown(e)
			for _, f := range []*Inflight{f2, f3} {
				err := resolved(t, f)
				assert.ErrorIs(t, err, e)
				assert.ErrorContains(t, err, "channel closed")
			}
			assert.ErrorIs(t, r.c.Closed(), e)
			r.c.mu.Lock()
			defer r.c.mu.Unlock()
			assert.Empty(t, r.c.pending)
			assert.Empty(t, r.c.unreturned)
		})
	})
	t.Run("without an error", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := startConfirmer(t)
			f, _ := r.publish("orders", "created", true, "m1")
			r.shutdown(nil) // closed by the application: no error
			err := resolved(t, f)
			assert.EqualError(t, err, "channel closed")
			assert.Equal(t, err, r.c.Closed())
		})
	})
	t.Run("returns first", func(t *testing.T) {
		// A return and then the close: the publishing fails with the close, not as returned
		// (its confirmation never came).
		synctest.Test(t, func(t *testing.T) {
			r := startConfirmer(t)
			f, _ := r.publish("orders", "created", true, "m1")
			r.ret("orders", "created", "m1")
			r.shutdown(&amqp.Error{Code: amqp.ChannelError, Reason: "gone"})
			err := resolved(t, f)
			var ret *ReturnedError
			assert.False(t, errors.As(err, &ret), "%v", err)
			assert.ErrorContains(t, err, "channel closed")
		})
	})
}

// amqp091 hands a return over before the confirmation of the same publishing, through
// channels that are buffered: both can be waiting when run next selects, and select picks
// at random. The return must be recorded first either way. Each round gives run both at
// once; without the drain of returns before a confirmation, about half the rounds fail.
func TestConfirmerRecordsReturnsHandedOverBeforeTheConfirmation(t *testing.T) {
	for round := range 64 {
		synctest.Test(t, func(t *testing.T) {
			r := newConfirmerRun(t)
			f1, tag1 := r.publish("orders", "created", true, "m1")
			f2, tag2 := r.publish("orders", "created", true, "m2")
			r.ret("orders", "created", "m1")
			r.ack(tag1)
			r.ack(tag2)
			r.start() // with the return and the confirmations all waiting

			var ret *ReturnedError
			assert.ErrorAs(t, resolved(t, f1), &ret, "round %d", round)
			assert.NoError(t, resolved(t, f2), "round %d", round)
		})
	}
}
