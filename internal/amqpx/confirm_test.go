package amqpx

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeChannel is a Confirmer's channel as amqp091 presents it, driven by the test: each
// publishing gets a confirmation of its own (delivery tags from 1), and ack, nack, ret and
// shutdown hand over what amqp091's reader would, in the order it would. The tests run in a
// synctest bubble: a wait that could never end fails the test.
type fakeChannel struct {
	c       *Confirmer
	returns chan amqp.Return
	states  chan *amqp.StateChanged
	closed  atomic.Bool
	sent    []*fakeConfirmation // by delivery tag - 1
	shut    bool
}

type fakeConfirmation struct {
	done chan struct{}
	ack  bool
}

func (d *fakeConfirmation) Done() <-chan struct{} { return d.done }

func (d *fakeConfirmation) Acked() bool {
	select {
	case <-d.done:
		return d.ack
	default:
		return false
	}
}

func startConfirmer(t *testing.T) *fakeChannel {
	ch := &fakeChannel{returns: make(chan amqp.Return, returnsBuffer), states: make(chan *amqp.StateChanged, 4)}
	ch.c = &Confirmer{
		send: func(string, string, bool, amqp.Publishing) (confirmation, error) {
			if ch.closed.Load() {
				return nil, amqp.ErrClosed
			}
			dc := &fakeConfirmation{done: make(chan struct{})}
			ch.sent = append(ch.sent, dc)
			return dc, nil
		},
		isClosed: ch.closed.Load,
		closeCh: func() error {
			ch.shutdown(nil)
			return nil
		},
		returns: ch.returns,
		done:    make(chan struct{}),
	}
	go ch.c.watch(ch.states)
	t.Cleanup(func() { ch.shutdown(nil) })
	return ch
}

// publish publishes through the Confirmer and returns the publishing and its delivery tag.
func (ch *fakeChannel) publish(t *testing.T, exchange, key string, mandatory bool, messageID string) (Inflight, uint64) {
	t.Helper()
	f, err := ch.c.Publish(context.Background(), exchange, key, mandatory, amqp.Publishing{MessageId: messageID})
	require.NoError(t, err)
	return f, uint64(len(ch.sent))
}

func (ch *fakeChannel) confirm(tag uint64, ack bool) {
	dc := ch.sent[tag-1]
	dc.ack = ack
	close(dc.done)
}

func (ch *fakeChannel) ack(tag uint64)  { ch.confirm(tag, true) }
func (ch *fakeChannel) nack(tag uint64) { ch.confirm(tag, false) }

func (ch *fakeChannel) ret(exchange, key, messageID string) {
	ch.returns <- amqp.Return{Exchange: exchange, RoutingKey: key, MessageId: messageID, ReplyCode: 312, ReplyText: "NO_ROUTE"}
}

// shutdown closes the channel as amqp091 does: it is marked closed, the returns are closed,
// what is in flight is nacked, and the last state change (with the error, if any) is
// handed over. It waits until the Confirmer has seen it.
func (ch *fakeChannel) shutdown(e *amqp.Error) {
	if ch.shut {
		return
	}
	ch.shut = true
	ch.closed.Store(true)
	close(ch.returns)
	for _, dc := range ch.sent {
		select {
		case <-dc.done:
		default:
			close(dc.done)
		}
	}
	var err error
	if e != nil {
		err = fmt.Errorf("channel shutdown error: %w", e)
	}
	ch.states <- &amqp.StateChanged{From: amqp.StateOpen, To: amqp.StateClosed, Err: err}
	close(ch.states)
	<-ch.c.Done()
}

// resolved returns f's result, which must be there.
func resolved(t *testing.T, f Inflight) error {
	t.Helper()
	synctest.Wait()
	select {
	case <-f.dc.Done():
		return f.Wait(context.Background())
	default:
		require.FailNow(t, "the publishing is not resolved")
		return nil
	}
}

// unresolved checks that f has no result yet.
func unresolved(t *testing.T, f Inflight) {
	t.Helper()
	synctest.Wait()
	select {
	case <-f.dc.Done():
		assert.Fail(t, "the publishing is resolved too early")
	default:
	}
}

func TestConfirmerAckAndNack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := startConfirmer(t)
		f1, tag1 := ch.publish(t, "orders", "created", true, "m1")
		f2, tag2 := ch.publish(t, "orders", "created", false, "m2")
		unresolved(t, f1)

		ch.nack(tag2) // confirmations may come in any order
		ch.ack(tag1)
		assert.NoError(t, resolved(t, f1))
		assert.ErrorIs(t, resolved(t, f2), ErrNacked)
		assert.Empty(t, ch.c.unclaimed)
	})
}

// A return resolves nothing by itself; the confirmation after it resolves the publishing
// to a *ReturnedError that says what was returned and why.
func TestConfirmerReturnBeforeAck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := startConfirmer(t)
		f, tag := ch.publish(t, "orders", "created", true, "m1")
		ch.ret("orders", "created", "m1")
		unresolved(t, f)

		ch.ack(tag)
		err := resolved(t, f)
		var ret *ReturnedError
		require.ErrorAs(t, err, &ret)
		assert.Equal(t, ReturnedError{Exchange: "orders", RoutingKey: "created", ReplyCode: 312, ReplyText: "NO_ROUTE"}, *ret)
		assert.Empty(t, ch.c.unclaimed)
	})
}

// A return carries no delivery tag: of mandatory publishings with the same exchange,
// routing key and message id, a confirmed one claims the oldest return of theirs.
func TestConfirmerReturnsOfTheSameKey(t *testing.T) {
	t.Run("first returned", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ch := startConfirmer(t)
			f1, tag1 := ch.publish(t, "orders", "created", true, "m")
			f2, tag2 := ch.publish(t, "orders", "created", true, "m")
			ch.ret("orders", "created", "m")
			ch.ack(tag1)
			ch.ack(tag2)
			var ret *ReturnedError
			assert.ErrorAs(t, resolved(t, f1), &ret)
			assert.NoError(t, resolved(t, f2))
		})
	})
	t.Run("second returned", func(t *testing.T) {
		// The broker confirms the first before it returns the second.
		synctest.Test(t, func(t *testing.T) {
			ch := startConfirmer(t)
			f1, tag1 := ch.publish(t, "orders", "created", true, "m")
			f2, tag2 := ch.publish(t, "orders", "created", true, "m")
			ch.ack(tag1)
			assert.NoError(t, resolved(t, f1))
			ch.ret("orders", "created", "m")
			ch.ack(tag2)
			var ret *ReturnedError
			assert.ErrorAs(t, resolved(t, f2), &ret)
		})
	})
	t.Run("both returned", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ch := startConfirmer(t)
			f1, tag1 := ch.publish(t, "orders", "created", true, "m")
			f2, tag2 := ch.publish(t, "orders", "created", true, "m")
			ch.ret("orders", "created", "m")
			ch.ret("orders", "created", "m")
			ch.ack(tag1)
			ch.ack(tag2)
			var ret *ReturnedError
			assert.ErrorAs(t, resolved(t, f2), &ret)
			assert.ErrorAs(t, resolved(t, f1), &ret)
		})
	})
}

// A return that matches no mandatory publishing (another exchange, routing key, message id
// or correlation id, or a publishing that was not mandatory) resolves nothing.
func TestConfirmerIgnoresUnknownReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := startConfirmer(t)
		f1, tag1 := ch.publish(t, "orders", "created", true, "m1")
		f2, tag2 := ch.publish(t, "orders", "paid", false, "m2")
		ch.ret("orders", "created", "other")
		ch.ret("billing", "created", "m1")
		ch.ret("orders", "deleted", "m1")
		ch.returns <- amqp.Return{Exchange: "orders", RoutingKey: "created", MessageId: "m1", CorrelationId: "c1"}
		ch.ret("orders", "paid", "m2") // not mandatory: never claimed
		unresolved(t, f1)
		unresolved(t, f2)

		ch.ack(tag1)
		ch.ack(tag2)
		assert.NoError(t, resolved(t, f1))
		assert.NoError(t, resolved(t, f2))
	})
}

// A publishing whose waiter gave up is confirmed later, with a return: the return is its
// own, not that of the next publishing of the same key.
func TestConfirmerDropsTheReturnsOfAbandonedPublishings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := startConfirmer(t)
		f1, tag1 := ch.publish(t, "orders", "created", true, "m")
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		assert.ErrorIs(t, f1.Wait(ctx), context.Canceled)
		ch.ret("orders", "created", "m")
		ch.ack(tag1)

		f2, tag2 := ch.publish(t, "orders", "created", true, "m")
		ch.ack(tag2)
		assert.NoError(t, resolved(t, f2))
		assert.Empty(t, ch.c.unclaimed)
		assert.Empty(t, ch.c.orphans)
	})
}

// Publish takes the returns handed over, so that amqp091's reader is not held back by a
// full buffer while no waiter takes them.
func TestConfirmerPublishTakesTheReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := startConfirmer(t)
		for range returnsBuffer {
			ch.ret("orders", "created", "gone")
		}
		ch.publish(t, "orders", "created", false, "m")
		assert.Zero(t, len(ch.returns))
		assert.Len(t, ch.c.unclaimed, returnsBuffer)
	})
}

// When the channel closes, every publishing in flight fails with the channel's error, and
// Closed reports it.
func TestConfirmerChannelCloseFailsEverythingPending(t *testing.T) {
	t.Run("with an error", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ch := startConfirmer(t)
			f1, tag1 := ch.publish(t, "orders", "created", true, "m1")
			f2, _ := ch.publish(t, "orders", "created", true, "m2")
			f3, _ := ch.publish(t, "orders", "paid", false, "m3")
			ch.ack(tag1)
			assert.NoError(t, resolved(t, f1))
			assert.NoError(t, ch.c.Closed(), "open")

			e := &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - inequivalent arg"}
			ch.shutdown(e)
			for _, f := range []Inflight{f2, f3} {
				err := resolved(t, f)
				assert.ErrorIs(t, err, e)
				assert.ErrorContains(t, err, "channel closed")
			}
			assert.ErrorIs(t, ch.c.Closed(), e)
			_, err := ch.c.Publish(context.Background(), "orders", "created", true, amqp.Publishing{})
			assert.ErrorIs(t, err, e, "a publish after the close fails with it")
		})
	})
	t.Run("without an error", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ch := startConfirmer(t)
			f, _ := ch.publish(t, "orders", "created", true, "m1")
			ch.shutdown(nil) // closed by the application: no error
			err := resolved(t, f)
			assert.EqualError(t, err, "channel closed")
			assert.Equal(t, err, ch.c.Closed())
		})
	})
	t.Run("returns first", func(t *testing.T) {
		// A return and then the close: the publishing fails with the close, not as returned
		// (its confirmation never came).
		synctest.Test(t, func(t *testing.T) {
			ch := startConfirmer(t)
			f, _ := ch.publish(t, "orders", "created", true, "m1")
			ch.ret("orders", "created", "m1")
			ch.shutdown(&amqp.Error{Code: amqp.ChannelError, Reason: "gone"})
			err := resolved(t, f)
			var ret *ReturnedError
			assert.False(t, errors.As(err, &ret), "%v", err)
			assert.ErrorContains(t, err, "channel closed")
		})
	})
}

// Retire closes the channel once everything in flight is settled; what the broker nacked
// is then a nack, not a failure of the close.
func TestConfirmerRetire(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ch := startConfirmer(t)
		f1, tag1 := ch.publish(t, "orders", "created", true, "m1")
		f2, tag2 := ch.publish(t, "orders", "created", true, "m2")
		ch.nack(tag1)
		ch.c.Retire()
		_, err := ch.c.Publish(context.Background(), "orders", "created", true, amqp.Publishing{})
		assert.ErrorIs(t, err, ErrRetired)
		synctest.Wait()
		assert.False(t, ch.closed.Load(), "a publishing is in flight")

		ch.ack(tag2)
		<-ch.c.Done()
		assert.ErrorIs(t, resolved(t, f1), ErrNacked)
		assert.NoError(t, resolved(t, f2))
	})
}
