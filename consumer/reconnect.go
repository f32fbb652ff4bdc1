package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
)

func (sub *subscription) run(ctx context.Context) {
	s := sub.s
	defer s.subs.Done()
	defer close(sub.out)
	defer sub.markReady() // ended: nobody waits for it any more
	fields := watermill.LogFields{"queue": sub.queue}

	// At most 1s (±50%) between tries: once the broker is back, consuming resumes within
	// about 1.5s, however long it was gone (with 5s, make faults saw 2.05s after a kill -9).
	// The wait starts over only after a session that consumed (or was paused by a kill): one
	// that the broker refuses every time (541 for a quorum queue that is down, say) backs off.
	// Each failure is logged once, here: the Dialer leaves a lost connection to this line.
	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval = 100 * time.Millisecond
	retry.MaxInterval = time.Second
	retry.MaxElapsedTime = 0 // until closed
	retry.Reset()            // the first wait is InitialInterval, not the default's 500ms
	for {
		err := sub.session(ctx)
		switch {
		case err == nil: // closed
			return
		case errors.Is(err, errQueueGone) && sub.mode == draining:
			sub.removeKilled()
			return
		case errors.Is(err, errQueueGone), errors.Is(err, errRefused):
			// Deleted, or refused for good (access refused): retrying cannot help.
			s.logger.Error("Consumer stopped for good", err, fields)
			s.goneMu.Lock()
			s.gone = append(s.gone, fmt.Errorf("consumer: queue %q: %w", sub.queue, err))
			s.goneMu.Unlock()
			return
		}
		if sub.steady {
			retry.Reset()
		}
		if sub.steady && sub.onIsolated { // consumed there: back to the main connection
			sub.isolated = false
		}
		wait := retry.NextBackOff()
		s.logger.Error("Consumer lost its channel, reconnecting", err, fields.Add(watermill.LogFields{"in": wait}))
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		case <-s.closing:
			return
		}
	}
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
