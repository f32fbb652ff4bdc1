package router

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/consumer"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/consumerconns"
	"github.com/warrenmq/warren/internal/telemetry"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/topology"
)

// Router runs handlers on RabbitMQ queues on top of Watermill's message.Router, with warren's
// default middleware chain on every handler, in this order (outermost first):
//
//  0. with Config.CopyStore only, middleware.Idempotent keyed by middleware.CopyKey: a copy
//     of a delivery that a process settled already (processed, retried or poisoned) is acked
//     without being handled; one that a process is handling now waits for it (up to
//     middleware.IdempotentConfig.BusyWait), then is acked, handled or requeued;
//  1. middleware.RetryCount: the attempt number, from warren's header, for all below;
//  2. Tracing.Middleware: the consumer span, around everything below, so that retries and
//     poison messages are published inside it and stay in the same trace;
//  3. Poison: whatever is given up on goes to the queue's poison queue, with the reason,
//     and is acked;
//  4. Backoff: a failure is republished to the queue with the next attempt's delay, and
//     acked; a permanent error or the last attempt's failure goes on to Poison;
//  5. recording messaging.process.duration: how long the handler took, and whether it
//     failed (error.type), as Backoff sees it;
//  6. publishing the messages the handler returns (to HandlerConfig.PublishTopic, or with
//     HandlerConfig.Reply to the request's reply-to), so that a failure to publish them is
//     retried and poisoned like any failure of the handler;
//  7. middleware.Recoverer: a panic becomes an error, with its stack;
//  8. the handler's own Middleware (HandlerConfig.Middleware), then the handler. An
//     idempotency guard of the handler's own goes here: middleware.Idempotent keyed by
//     middleware.MessageIDKey (or a key of the user's own) makes the handler succeed once
//     per key; a copy that finds the key held by another holder waits for it (up to
//     middleware.IdempotentConfig.BusyWait, then it goes back to the queue as a
//     *middleware.RequeueError, neither retried nor poisoned), one that finds it processed
//     is acked unhandled.
//
// Publishing (Publisher, and the messages handlers return) goes through warren's DLX
// publisher, traced. A retry or poison copy that cannot be published, and a handler error
// caused by the shutdown, are no failures of the handler: the message goes back to its queue
// (see middleware.RequeueError), after Config.RequeueDelay.
type Router struct {
	cfg     Config
	logger  watermill.LoggerAdapter
	wm      *message.Router
	tracing *middleware.Tracing
	// pubConn is the router's publishing connection, which its DLX publishers share (each on
	// a confirm channel of its own), and where its subscribers publish (see consumerconns.Conns);
	// subConns are the connections every handler's subscriber consumes on.
	pubConn   *amqpx.Conn
	subConns  *consumerconns.Conns
	out       *dlx.Publisher // Publisher and handler outputs, routed by Config.Route
	retries   *dlx.Publisher // retries and poison messages, routed to queues
	direct    *dlx.Publisher // replies to direct reply-to addresses, not mandatory
	pub       message.Publisher
	retryPub  message.Publisher
	directPub message.Publisher
	metrics   *telemetry.Instruments
	consumes  telemetry.Consumes // attribute sets of messaging.process.duration

	mu        sync.Mutex
	topo      topology.Topology // the handlers' queues, exchanges and bindings
	names     map[string]bool
	subs      []*consumer.Subscriber
	runDone   chan struct{} // made by Run, closed when Watermill's Run has returned
	running   chan struct{} // closed once every handler consumes (see Running)
	closed    bool
	closing   chan struct{} // closed by Close
	closeOnce sync.Once
	closeErr  error
}

// New connects the router's publishers and declares Config.Declare.
func New(config Config, logger watermill.LoggerAdapter) (*Router, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config = config.WithDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	r := &Router{cfg: config, logger: logger, names: map[string]bool{}, closing: make(chan struct{}), running: make(chan struct{})}
	wm, err := message.NewRouter(message.RouterConfig{CloseTimeout: config.ShutdownTimeout + 5*time.Second},
		stopLogger{logger, r})
	if err != nil {
		return nil, err
	}
	tracing, err := middleware.NewTracing(middleware.TracingConfig{TracerProvider: config.TracerProvider})
	if err != nil {
		return nil, err
	}
	metrics, err := telemetry.New(config.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	r.pubConn = amqpx.NewConn(amqpx.NewDialer(config.Connection, "warren publisher", logger))
	r.subConns = consumerconns.New(config.Connection, "warren subscriber", r.pubConn, logger)
	pcfg := config.publisher()
	out, err := publisherOn(r.pubConn, pcfg, true, logger)
	if err != nil {
		return nil, errors.Join(err, r.pubConn.Close())
	}
	pcfg.Route, pcfg.Declare, pcfg.AllowUnroutable = retryRoute, topology.Topology{}, false
	retries, err := publisherOn(r.pubConn, pcfg, false, logger)
	if err != nil {
		return nil, errors.Join(err, out.Close(), r.pubConn.Close())
	}
	// Replies to direct reply-to addresses: without the mandatory flag (see publishReply).
	pcfg.AllowUnroutable = true
	direct, err := publisherOn(r.pubConn, pcfg, false, logger)
	if err != nil {
		return nil, errors.Join(err, out.Close(), retries.Close(), r.pubConn.Close())
	}
	r.wm, r.tracing, r.metrics, r.out, r.retries, r.direct = wm, tracing, metrics, out, retries, direct
	r.pub, r.retryPub, r.directPub = tracing.Publisher(out), tracing.Publisher(retries), tracing.Publisher(direct)
	return r, nil
}

// publisherOn returns a DLX publisher of config (the router's shared fields set) that
// publishes on conn, the router's publishing connection, on a confirm channel of its own;
// with declare set, it connects now and declares the delay levels and Config.Declare.
func publisherOn(conn *amqpx.Conn, config dlx.Config, declare bool, logger watermill.LoggerAdapter) (*dlx.Publisher, error) {
	return dlx.NewPublisherOn(conn, config, declare, logger)
}

// retryRoute sends retries to the queue named by the topic, and poison messages to the
// poison queue. Both exist: the message was consumed from the one, declared with the other.
func retryRoute(topic string) dlx.Route {
	r := dlx.ToQueue(topic)
	r.Declared = true
	return r
}

// Publisher publishes through warren's DLX publisher (delays, confirms), traced, to the
// destinations of Config.Route. Like a handler's outputs, what it publishes carries
// none of a delivery's bookkeeping (warren.IsBookkeeping): a copy of a message being
// handled starts at attempt 1 where it goes. Closing it does nothing: the router closes it.
func (r *Router) Publisher() message.Publisher { return freshPublisher{r.pub} }

// fresh returns m without bookkeeping (see warren.IsBookkeeping), the same message when
// it has none, else a copy of it (in its context): every message a handler sends on (its
// outputs and replies, a copy of the message it got, what it publishes through Publisher)
// is a new hop and starts at attempt 1, and the caller's m is left as it is (it may be the
// message being handled, whose bookkeeping its retry needs).
func fresh(m *message.Message) *message.Message {
	for k := range m.Metadata {
		if warren.IsBookkeeping(k) {
			c := m.Copy()
			c.SetContext(m.Context())
			for k := range c.Metadata {
				if warren.IsBookkeeping(k) {
					delete(c.Metadata, k)
				}
			}
			return c
		}
	}
	return m
}

// freshPublisher publishes the messages without bookkeeping (see fresh); Close does nothing.
type freshPublisher struct{ message.Publisher }

func (p freshPublisher) Publish(topic string, msgs ...*message.Message) error {
	out := make([]*message.Message, len(msgs))
	for i, m := range msgs {
		out[i] = fresh(m)
	}
	return p.Publisher.Publish(topic, out...)
}

func (freshPublisher) Close() error { return nil }
