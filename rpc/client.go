package rpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/middleware"
)

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
