package rpc

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/topology"
)

// ClientConfig configures a Client.
type ClientConfig struct {
	// Connection says how to reach the broker (URL required). A lost connection is opened
	// again at once, with backoff, for as long as the client is open.
	Connection warren.Connection
	// Route maps a topic to where its requests are published. Default dlx.ToQueue (the
	// server's queue, named like the topic). The destination is never declared.
	Route func(topic string) dlx.Route
	// ReplyQueue, when set, is the name of the client's own reply queue; empty (the
	// default) uses RabbitMQ's direct reply-to. See the package doc for the choice.
	ReplyQueue string
	// ReplyQueueType is the type of the reply queue. Default topology.Quorum.
	ReplyQueueType topology.QueueType
	// ReplyQueueExpires is how long the reply queue lives without a consumer before the
	// broker deletes it (x-expires): longer than the client may stay disconnected. Default
	// DefaultReplyQueueExpires.
	ReplyQueueExpires time.Duration
	// Timeout bounds a Call (publishing and waiting for the reply) and a Send, unless its
	// context ends earlier. Default DefaultTimeout.
	Timeout time.Duration
	// Marshaler turns requests into publishings and replies into messages. Default
	// warren.Marshaler{}.
	Marshaler wamqp.Marshaler
	// TracerProvider traces requests: a producer span per request (until the broker's
	// confirmation), a child of the span in the context of Call or Send (or of the
	// message), whose trace context travels in the request's metadata, so that the
	// server's processing and its reply belong to the caller's trace. Default:
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

// Defaults of ClientConfig.
const (
	DefaultTimeout           = 30 * time.Second
	DefaultReplyQueueExpires = 10 * time.Minute
)

// WithDefaults returns c with every unset field set to its default.
func (c ClientConfig) WithDefaults() ClientConfig {
	c.Connection = c.Connection.WithDefaults()
	if c.Route == nil {
		c.Route = dlx.ToQueue
	}
	if c.ReplyQueueType == "" {
		c.ReplyQueueType = topology.Quorum
	}
	if c.ReplyQueueExpires == 0 {
		c.ReplyQueueExpires = DefaultReplyQueueExpires
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Marshaler == nil {
		c.Marshaler = warren.Marshaler{}
	}
	return c
}

// Validate reports the first field of c that is not usable. No error contains a password
// of ClientConfig.Connection.URL.
func (c ClientConfig) Validate() error {
	if err := c.Connection.Validate(); err != nil {
		return fmt.Errorf("rpc: ClientConfig.%w", err)
	}
	switch {
	case c.Timeout < 0:
		return fmt.Errorf("rpc: ClientConfig.Timeout %s is negative", c.Timeout)
	case c.ReplyQueueExpires < 0:
		return fmt.Errorf("rpc: ClientConfig.ReplyQueueExpires %s is negative", c.ReplyQueueExpires)
	case c.ReplyQueueExpires > 0 && c.ReplyQueueExpires < time.Millisecond:
		return fmt.Errorf("rpc: ClientConfig.ReplyQueueExpires %s is below 1ms", c.ReplyQueueExpires)
	case strings.HasPrefix(c.ReplyQueue, "amq."):
		return fmt.Errorf("rpc: ClientConfig.ReplyQueue %q: names starting with amq. are the broker's "+
			"(leave it empty for direct reply-to)", c.ReplyQueue)
	case len(c.ReplyQueue) > 255:
		return fmt.Errorf("rpc: ClientConfig.ReplyQueue is %d bytes long, the limit is 255", len(c.ReplyQueue))
	case c.ReplyQueueType != "" && c.ReplyQueueType != topology.Quorum && c.ReplyQueueType != topology.Classic:
		return fmt.Errorf("rpc: ClientConfig.ReplyQueueType %q is neither %q nor %q", c.ReplyQueueType, topology.Quorum, topology.Classic)
	}
	return nil
}

// Client sends requests and receives their replies on one connection (see the package doc).
// It is safe for concurrent use; any number of calls may be in flight at once.
type Client struct {
	cfg     ClientConfig
	logger  watermill.LoggerAdapter
	dialer  *amqpx.Dialer
	tracing *middleware.Tracing
	direct  bool

	mu      sync.Mutex
	sess    *session      // nil while (re)connecting
	ready   chan struct{} // closed once sess is set
	pending map[string]*call
	closed  bool

	ctx  context.Context // ends with Close
	stop context.CancelFunc
	done <-chan struct{} // ctx.Done()
	wg   sync.WaitGroup
}

// call is a request in flight, by its correlation id.
type call struct {
	reply    result        // the reply (or error reply), set before answered is closed
	answered chan struct{} // closed once reply is set (a channel without pointers: one allocation)
	taken    atomic.Bool   // a reply was taken: a second one (the request processed twice) is dropped
	sent     atomic.Bool   // the broker confirmed the request
}

type result struct {
	msg *message.Message
	err error
}

// NewClient connects, and with ClientConfig.ReplyQueue declares the reply queue, retrying
// until Connection.ConnectTimeout.
func NewClient(config ClientConfig, logger watermill.LoggerAdapter) (*Client, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config = config.WithDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	tracing, err := middleware.NewTracing(middleware.TracingConfig{TracerProvider: config.TracerProvider})
	if err != nil {
		return nil, fmt.Errorf("rpc: %w", err)
	}
	c := &Client{
		tracing: tracing,
		cfg:     config,
		logger:  logger,
		dialer:  amqpx.NewDialer(config.Connection, "warren rpc client", logger),
		direct:  config.ReplyQueue == "",
		ready:   make(chan struct{}),
		pending: map[string]*call{},
	}
	c.ctx, c.stop = context.WithCancel(context.Background())
	c.done = c.ctx.Done()
	var s *session
	err = amqpx.RetryLogged(c.ctx, config.Connection.ConnectTimeout, "rpc: connect", logger, nil,
		func(ctx context.Context) (err error) {
			s, err = c.open(ctx)
			return err
		})
	if err != nil {
		c.stop()
		return nil, err
	}
	c.setSession(s)
	c.wg.Add(1)
	go c.run(s)
	return c, nil
}

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

// run opens the connection again whenever it is lost, until Close.
func (c *Client) run(s *session) {
	defer c.wg.Done()
	for {
		select {
		case <-c.done:
			return
		case <-s.done:
		}
		c.mu.Lock()
		if c.sess == s {
			c.sess, c.ready = nil, make(chan struct{})
		}
		c.mu.Unlock()
		_ = amqpx.Close(s.conn)
		c.logger.Info("rpc: reconnecting", watermill.LogFields{"cause": s.conf.Closed()})
		for {
			err := amqpx.RetryLogged(c.ctx, c.cfg.Connection.ConnectTimeout, "rpc: reconnect", c.logger, nil,
				func(ctx context.Context) (err error) {
					s, err = c.open(ctx)
					return err
				})
			if err == nil {
				break
			}
			select { // a refusal (the reply queue's consumer taken) is tried again after a pause
			case <-c.done:
				return
			case <-time.After(reconnectPause):
			}
		}
		if !c.setSession(s) {
			return
		}
	}
}

// reconnectPause separates two rounds of reconnection that both failed.
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
		return p, fmt.Errorf("message %s: %w", msg.UUID, dlx.ErrTooLarge)
	}
	return p, nil
}

// Close fails the calls in flight with warren.ErrClosed, deletes the reply queue (with
// ClientConfig.ReplyQueue) and closes the connection. Close may be called more than once.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	s := c.sess
	c.mu.Unlock()
	c.stop()
	var err error
	if s != nil {
		if !c.direct {
			err = c.deleteReplyQueue(s)
		}
		err = errors.Join(err, amqpx.Close(s.conn))
	}
	c.wg.Wait()
	return err
}

// deleteReplyQueue deletes the reply queue, on a channel of its own.
func (c *Client) deleteReplyQueue(s *session) error {
	ctx, cancel := context.WithTimeout(context.Background(), amqpx.CloseTimeout)
	defer cancel()
	stop := amqpx.Watch(ctx, s.conn)
	defer stop()
	ch, err := s.conn.Channel()
	if err != nil {
		return fmt.Errorf("rpc: delete reply queue %q: %w", c.cfg.ReplyQueue, err)
	}
	defer ch.Close()
	if _, err := ch.QueueDelete(c.cfg.ReplyQueue, false, false, false); err != nil {
		return fmt.Errorf("rpc: delete reply queue %q: %w", c.cfg.ReplyQueue, err)
	}
	return nil
}
