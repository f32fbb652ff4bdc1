package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
)

// consumerBackoff is the wait between a subscription's sessions: at most 1 s (±50%), so that
// consuming resumes soon after the broker is back however long it was gone, starting over
// only after a session that consumed (or was paused by a kill): one that the broker refuses
// every time (541 for a quorum queue that is down, say) backs off.
var consumerBackoff = amqpx.Backoff{Initial: 100 * time.Millisecond, Max: time.Second}

// run runs the subscription's sessions until it is closed, its context ends or its queue is
// gone, with warren's one reconnect loop. Each failure is logged once, here: the Dialer leaves
// a lost connection to this line.
func (sub *subscription) run(ctx context.Context) {
	s := sub.s
	defer s.subs.Done()
	defer close(sub.over)
	if sub.closeOut {
		defer close(sub.out)
	}
	defer sub.markReady() // ended: nobody waits for it any more
	fields := watermill.LogFields{"queue": sub.queue}
	// Closing ends the waits between sessions, as ctx does; a session itself hears closing on
	// its own (it lets the handlers in flight finish), so it runs on ctx.
	waits, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-waits.Done():
		}
	}()
	_ = amqpx.Reconnect(waits, consumerBackoff, func(_ context.Context, steady func()) error {
		err := sub.session(ctx)
		if err == nil || sub.ended(err, fields) {
			return nil
		}
		if sub.steady {
			steady()
			if sub.onIsolated { // consumed there: back to the main connection
				sub.isolated = false
			}
		}
		return err
	}, amqpx.LogEach(s.logger, "Consumer lost its channel, reconnecting", fields))
}

// ended reports whether err, a session's, ends the subscription for good: its queue was
// deleted (a drained queue's kill state goes with it) or the broker refused it in a way that
// retrying cannot help (access refused).
func (sub *subscription) ended(err error, fields watermill.LogFields) bool {
	s := sub.s
	switch {
	case errors.Is(err, errQueueGone) && sub.mode == draining:
		sub.removeKilled()
		return true
	case errors.Is(err, errQueueGone), errors.Is(err, errRefused):
		s.logger.Error("Consumer stopped for good", err, fields)
		s.goneMu.Lock()
		s.gone = append(s.gone, fmt.Errorf("consumer: queue %q: %w", sub.consumed, err))
		s.goneMu.Unlock()
		return true
	}
	return false
}

// connection returns the open main consuming connection, dialling when there is none (see
// connectionOn).
func (s *Subscriber) connection(ctx context.Context) (*amqp.Connection, error) {
	return s.connectionOn(ctx, s.conns.Main.Conn)
}

// connectionOn returns c's open connection, dialling when there is none: one call at a time
// dials, without holding s.mu (Close is never held up by a dial); the others wait for it, each
// until its own ctx ends. A dial and the wait for it are bounded by ctx and ConnectTimeout.
func (s *Subscriber) connectionOn(ctx context.Context, c *amqpx.Conn) (*amqp.Connection, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, errSubscriberClosed
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Connection.ConnectTimeout)
	defer cancel()
	conn, err := c.Get(ctx)
	if errors.Is(err, amqpx.ErrConnClosed) {
		return nil, errSubscriberClosed
	}
	return conn, err
}

// closesConnection reports whether err is the broker's refusal that closes the whole
// connection (an AMQP connection exception, such as 541 INTERNAL_ERROR), not only a channel.
// 320 CONNECTION_FORCED is no refusal: the broker stops, or an operator closed the connection.
func closesConnection(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Server && !ae.Recover && ae.Code != amqp.ConnectionForced
}
