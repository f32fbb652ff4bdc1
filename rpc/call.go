package rpc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/amqpx"
)

// Call publishes msg to topic's destination as a request, and returns the reply. It fails
// when ctx ends or ClientConfig.Timeout has elapsed first (the error then wraps
// context.DeadlineExceeded, or ctx's cause), with a *RemoteError when the server gave the
// request up (it is in the poison queue), with a *dlx.ReturnedError when no queue takes the
// request, and with ErrReplyLost when the direct reply-to connection was lost while waiting.
// The request gets a new correlation id and the reply-to; msg's other metadata are sent as
// headers.
func (c *Client) Call(ctx context.Context, topic string, msg *message.Message) (*message.Message, error) {
	r, err := c.roundTrip(ctx, topic, msg, true)
	if err != nil {
		return nil, fmt.Errorf("rpc: call %q: %w", topic, err)
	}
	return r, nil
}

// Send publishes msg to topic's destination as a request without reply-to (the server's
// reply is dropped), and returns once the broker has confirmed it; it fails like Call
// except for the reply. msg gets a new correlation id.
func (c *Client) Send(ctx context.Context, topic string, msg *message.Message) error {
	if _, err := c.roundTrip(ctx, topic, msg, false); err != nil {
		return fmt.Errorf("rpc: send to %q: %w", topic, err)
	}
	return nil
}

func (c *Client) roundTrip(parent context.Context, topic string, msg *message.Message, wait bool) (*message.Message, error) {
	ctx, cancel := context.WithTimeout(parent, c.cfg.Timeout)
	defer cancel()
	id := watermill.NewUUID()
	k := &call{answered: make(chan struct{})}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, fmt.Errorf("client is %w", warren.ErrClosed)
	}
	c.pending[id] = k
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
	}()

	if !trace.SpanContextFromContext(msg.Context()).IsValid() {
		msg.SetContext(parent) // the request's producer span is a child of the caller's
	}
	var s *session
	send := func(ctx context.Context, msg *message.Message) error {
		pub, err := c.publishing(msg, id, wait)
		if err != nil {
			return err
		}
		route := c.cfg.Route(topic)
		deadline, _ := ctx.Deadline()
		return amqpx.Retry(ctx, time.Until(deadline), "", func(ctx context.Context) error {
			var err error
			if s, err = c.current(ctx); err != nil {
				return err
			}
			f, err := s.conf.Publish(ctx, route.Exchange, route.RoutingKey, true, pub)
			if err == nil {
				err = f.Wait(ctx) // a return comes before the confirmation: the result says so
			}
			var ret *dlx.ReturnedError
			if errors.As(err, &ret) {
				return amqpx.GiveUp(err)
			}
			return err
		})
	}
	// Traced: a producer span, and the trace context in the request's metadata.
	err := c.tracing.Publisher(publisherFunc(func(_ string, msgs ...*message.Message) error {
		return send(ctx, msgs[0])
	})).Publish(topic, msg)
	if err != nil {
		return nil, c.ended(parent, ctx, "publish the request", id, err)
	}
	k.sent.Store(true)
	if !wait {
		return nil, nil
	}
	var lost <-chan struct{}
	if c.direct {
		lost = s.done
	}
	select {
	case <-k.answered:
		return k.reply.msg, k.reply.err
	case <-lost:
		select {
		case <-k.answered: // it came before the connection was lost
			return k.reply.msg, k.reply.err
		case <-c.done: // Close stops the client before it closes the connection
			return nil, fmt.Errorf("client is %w", warren.ErrClosed)
		default:
		}
		return nil, fmt.Errorf("%w: direct reply-to, and the connection was lost (%v) after the request "+
			"(correlation id %s) was sent; it may still be processed", ErrReplyLost, s.conf.Closed(), id)
	case <-c.done:
		return nil, fmt.Errorf("client is %w", warren.ErrClosed)
	case <-ctx.Done():
		return nil, c.ended(parent, ctx, "no reply", id, nil)
	}
}

// publisherFunc is a message.Publisher of one function.
type publisherFunc func(topic string, msgs ...*message.Message) error

func (f publisherFunc) Publish(topic string, msgs ...*message.Message) error {
	return f(topic, msgs...)
}
func (publisherFunc) Close() error { return nil }

// ended is the error of a call that failed with err (nil: no reply came) or whose context
// ended: "no reply within ClientConfig.Timeout 300ms (correlation id X): context deadline
// exceeded".
func (c *Client) ended(parent, ctx context.Context, what, id string, err error) error {
	last := ""
	if err != nil {
		last = fmt.Sprintf(" (last error: %v)", err)
	}
	switch {
	case parent.Err() != nil:
		return fmt.Errorf("%s (correlation id %s): %w%s", what, id, context.Cause(parent), last)
	case ctx.Err() != nil:
		return fmt.Errorf("%s within ClientConfig.Timeout %s (correlation id %s): %w%s", what, c.cfg.Timeout, id, context.DeadlineExceeded, last)
	}
	return fmt.Errorf("%s (correlation id %s): %w", what, id, err)
}

// publishing is msg as a request with correlation id id and, with reply, the reply-to.
func (c *Client) publishing(msg *message.Message, id string, reply bool) (amqp.Publishing, error) {
	p, err := c.cfg.Marshaler.Marshal(msg)
	if err != nil {
		return p, fmt.Errorf("marshal message %s: %w", msg.UUID, err)
	}
	for k := range p.Headers {
		if warren.IsDelayMetadata(k) || k == warren.MetadataPublishID {
			delete(p.Headers, k) // instructions to dlx's publisher, which requests do not go through
		}
	}
	// The properties only: the server's subscriber maps them to metadata.
	delete(p.Headers, warren.MetadataCorrelationID)
	delete(p.Headers, warren.MetadataReplyTo)
	p.CorrelationId, p.ReplyTo = id, ""
	if reply {
		p.ReplyTo = c.cfg.ReplyQueue
		if c.direct {
			p.ReplyTo = warren.DirectReplyTo // the broker replaces it with the channel's address
		}
	}
	if size, err := amqpx.HeaderFrameSize(p); err != nil || size > amqpx.MaxHeaderFrame {
		return p, fmt.Errorf("message %s: %w", msg.UUID, warren.ErrTooLarge)
	}
	return p, nil
}
