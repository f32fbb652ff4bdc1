package rpc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
)

// session is one connection and its channel, which publishes the requests and consumes the
// replies (direct reply-to needs both on one channel).
type session struct {
	conn *amqp.Connection
	conf *amqpx.Confirmer // the channel: conf.Closed() says why it closed
	done chan struct{}    // closed once the channel is closed and every reply on it handed over
}

// open connects, opens the channel in confirm mode and consumes the replies.
func (c *Client) open(ctx context.Context) (*session, error) {
	conn, err := c.dialer.Dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	s, err := c.setUp(ctx, conn)
	if err != nil {
		_ = amqpx.Close(conn)
		return nil, amqpx.GiveUpIfRefused(err)
	}
	return s, nil
}

func (c *Client) setUp(ctx context.Context, conn *amqp.Connection) (*session, error) {
	stop := amqpx.Watch(ctx, conn)
	defer stop()
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	conf, err := amqpx.NewConfirmer(ch)
	if err != nil {
		return nil, err
	}
	source := warren.DirectReplyTo
	if !c.direct {
		source = c.cfg.ReplyQueue
		args := amqp.Table{"x-expires": c.cfg.ReplyQueueExpires.Milliseconds(), amqp.QueueTypeArg: string(c.cfg.ReplyQueueType)}
		if _, err := ch.QueueDeclare(source, true, false, false, false, args); err != nil {
			return nil, fmt.Errorf("declare reply queue %q: %w", source, err)
		}
		if err := ch.Qos(replyPrefetch, 0, false); err != nil {
			return nil, fmt.Errorf("prefetch: %w", err)
		}
	}
	// Direct reply-to is consumed without acks; a reply queue with them, by this client only.
	deliveries, err := ch.Consume(source, "", c.direct, !c.direct, false, false, nil)
	if err != nil {
		return nil, fmt.Errorf("consume replies from %q: %w", source, err)
	}
	if !c.direct {
		// A quorum queue takes a second consumer even when the first is exclusive (RabbitMQ
		// 3.10.8 and 4.0.5): count them. A consumer of a connection that was just lost may
		// still be counted; the reconnection is then tried again.
		q, err := ch.QueueDeclarePassive(source, true, false, false, false, nil)
		if err != nil {
			return nil, fmt.Errorf("inspect reply queue %q: %w", source, err)
		}
		if q.Consumers > 1 {
			return nil, amqpx.GiveUp(fmt.Errorf("%w: reply queue %q has %d consumers: another client uses it "+
				"(each client needs a reply queue of its own)", errReplyQueueTaken, source, q.Consumers))
		}
	}
	s := &session{conn: conn, conf: conf, done: make(chan struct{})}
	consumed := make(chan struct{})
	c.wg.Add(2)
	go func() {
		defer c.wg.Done()
		defer close(consumed)
		c.consume(deliveries)
		// Also when the broker cancelled the consumer (its queue's node went down) on a channel
		// that stays open: the session ends, and the next one consumes again.
		_ = ch.Close()
	}()
	go func() {
		defer c.wg.Done()
		<-conf.Done() // every request in flight on the channel failed
		<-consumed    // the replies that came before the close are handed over first
		close(s.done)
	}()
	return s, nil
}

// errReplyQueueTaken: another client consumes the reply queue.
var errReplyQueueTaken = errors.New("reply queue taken")

// replyPrefetch is how many replies of a reply queue the broker sends before their acks.
const replyPrefetch = 1000

// consume hands each reply to its call, until the channel closes.
func (c *Client) consume(deliveries <-chan amqp.Delivery) {
	for d := range deliveries {
		id := d.CorrelationId
		msg, err := c.cfg.Marshaler.Unmarshal(d)
		if err == nil {
			msg.Metadata.Set(warren.MetadataCorrelationID, id)
			if rerr := remoteError(msg); rerr != nil {
				msg, err = nil, rerr
			}
		}
		c.mu.Lock()
		k := c.pending[id]
		c.mu.Unlock()
		if k != nil {
			if k.taken.CompareAndSwap(false, true) { // else a second reply: the first one counts
				k.reply = result{msg, err}
				close(k.answered)
			}
		} else {
			c.logger.Debug("Reply to no call in flight dropped (its call gave up, or a copy)",
				watermill.LogFields{"correlation_id": id})
		}
		if !c.direct {
			_ = d.Ack(false) // a lost ack brings the reply again, which is then dropped
		}
	}
}

// setSession makes s the current session, unless the client is closed (s is then closed).
func (c *Client) setSession(s *session) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		_ = amqpx.Close(s.conn)
		return false
	}
	c.sess = s
	close(c.ready)
	return true
}

// run opens the connection again whenever it is lost, until Close, in warren's one reconnect
// loop: s is the session open now; a round of reconnection (RetryLogged, within
// ConnectTimeout) that fails (a refusal: the reply queue's consumer taken) is tried again
// after a pause that grows to reconnectPause.
func (c *Client) run(s *session) {
	defer c.wg.Done()
	_ = amqpx.Reconnect(c.ctx, amqpx.Backoff{Initial: 100 * time.Millisecond, Max: reconnectPause},
		func(ctx context.Context, steady func()) error {
			if s == nil {
				err := amqpx.RetryLogged(ctx, c.cfg.Connection.ConnectTimeout, "rpc: reconnect", c.logger, nil,
					func(ctx context.Context) (err error) {
						s, err = c.open(ctx)
						return err
					})
				if err != nil {
					return err
				}
				if !c.setSession(s) {
					return nil
				}
			}
			steady()
			select {
			case <-c.done:
				return nil
			case <-s.done:
			}
			c.drop(s)
			s = nil
			return errConnectionLost // drop logged why
		}, nil)
}

// errConnectionLost ends a session of run whose connection was lost.
var errConnectionLost = errors.New("rpc: connection lost")

// drop forgets s, whose connection was lost, and closes it: calls wait for the next session.
func (c *Client) drop(s *session) {
	c.mu.Lock()
	if c.sess == s {
		c.sess, c.ready = nil, make(chan struct{})
	}
	c.mu.Unlock()
	_ = amqpx.Close(s.conn)
	c.logger.Info("rpc: reconnecting", watermill.LogFields{"cause": s.conf.Closed()})
}

// reconnectPause is the longest pause between two rounds of reconnection that both failed.
const reconnectPause = 2 * time.Second

// current returns the open session, waiting for a reconnection until ctx ends.
func (c *Client) current(ctx context.Context) (*session, error) {
	for {
		c.mu.Lock()
		s, ready, closed := c.sess, c.ready, c.closed
		c.mu.Unlock()
		switch {
		case closed:
			return nil, amqpx.GiveUp(fmt.Errorf("rpc: client is %w", warren.ErrClosed))
		case s != nil:
			return s, nil
		}
		select {
		case <-ready:
		case <-c.done:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for the connection: %w", context.Cause(ctx))
		}
	}
}
