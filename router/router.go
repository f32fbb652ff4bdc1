package router

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/consumer"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/consumerconns"
	"github.com/warrenmq/warren/internal/shared"
	"github.com/warrenmq/warren/internal/telemetry"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/topology"
)

// Config configures a Router. The settings of its publishers and subscribers are theirs,
// held in Publisher and Subscriber; what they share (Connection, Topology, Declare,
// MeterProvider) is set once, here.
type Config struct {
	// Connection says how to reach the broker (URL required); the router's publishers and
	// every handler's subscriber connect with it.
	Connection warren.Connection
	// Topology configures the builder (queue type, delivery limit, delay levels).
	Topology topology.Config
	// Declare is declared when the router runs, before the handlers' own queues and
	// bindings. A handler's queue listed here is declared as listed (type, delivery limit).
	Declare topology.Topology
	// Route says where Publisher and the messages handlers return go, per topic (see
	// dlx.Config.Route; retries and poison copies always go to queues). Default: the topic is
	// a queue, published to through the default exchange.
	Route func(topic string) dlx.Route
	// AllowUnroutable publishes what Route sends nowhere without the mandatory flag: the
	// broker then drops it instead of failing the publish.
	AllowUnroutable bool
	// Marshaler turns messages into publishings and deliveries back into messages. Default
	// warren.Marshaler{}. A delivery it cannot unmarshal goes to the poison queue with the
	// reason.
	Marshaler wamqp.Marshaler
	// PublishTimeout bounds one publish (an output, a retry, a poison copy, a reply), retries
	// included. Default 30s.
	PublishTimeout time.Duration
	// PastTolerance is how far in the past a DeliverAt time may lie (it is then delivered at
	// once) before it is an error. Default 1s.
	PastTolerance time.Duration
	// Concurrency is how many messages each handler processes at once, unless
	// HandlerConfig.Concurrency says otherwise. Default 64.
	Concurrency int
	// Prefetch is how many messages the broker sends each handler ahead of their acks (see
	// consumer.Config.Prefetch). Default: 4×the handler's Concurrency, at most 65535.
	Prefetch int
	// ShutdownTimeout bounds how long closing waits for the messages handed out to be acked;
	// it also bounds Close. Default 30s.
	ShutdownTimeout time.Duration
	// RequeueDelay is how long a message that is nacked waits before it goes back to its
	// queue (see consumer.Config.RequeueDelay). Default 1s.
	RequeueDelay time.Duration
	// KillSecret, when set, makes every handler obey only kill commands signed with it (see
	// kill.Killer); others are refused and logged.
	KillSecret []byte
	// KillMaxAge bounds the age of a kill command received, against replays. Default 1m.
	KillMaxAge time.Duration
	// KillClockSkew is how far ahead of this clock a kill command may be dated. Default 5s.
	KillClockSkew time.Duration
	// OnKill, when set, is told what each handler's subscription does about the kill topic.
	OnKill func(KillEvent)
	// Retry is the retry schedule of handlers that do not set one. Its Publisher and
	// MeterProvider are the router's, whatever is set there. Default: exponential from 1s,
	// doubling, capped at 5m, 5 attempts.
	Retry middleware.BackoffConfig
	// CopyStore, when set, is where the router's processes recognise copies of a message
	// that reach different processes (see middleware.Idempotent with middleware.CopyKey,
	// which the router then runs outermost): a publisher's re-send after a lost confirm, or a
	// redelivery after an ack lost with its connection, is then acked without being handled
	// again. Without it, each subscriber recognises the copies that reach its own process
	// only, and a copy that reaches another one is handled again, with attempts of its own.
	// Use a store the processes share, such as redisstore's; the router does not close it.
	// It does not recognise a message that a producer published twice with the same
	// message id (two publishes, two publish ids): for that, add middleware.Idempotent keyed
	// by middleware.MessageIDKey to HandlerConfig.Middleware (see Router, item 8).
	CopyStore middleware.IdempotencyStore
	// TracerProvider traces publishing and processing. Default: otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider records the metrics of the router's publishers, subscribers and
	// middleware chain (the messaging semantic conventions' and warren's own: see the
	// README's Metrics); the router sets it on Publisher, Subscriber and every retry
	// schedule. Default: otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// HandleSignals makes Run stop gracefully on SIGINT and SIGTERM too, for a main function
	// that runs only the router. Off by default: a router embedded in a larger program stops
	// when Run's context ends or Close is called, and leaves the signals to the program.
	HandleSignals bool
}

// KillEvent tells what a handler's subscription did about the kill topic (see
// Config.OnKill); it is consumer.KillEvent, the receiving side's.
type KillEvent = consumer.KillEvent

// WithDefaults returns c with every unset field set to its default; Prefetch stays unset
// (each handler's default is 4×its Concurrency).
func (c Config) WithDefaults() Config {
	c.Connection = c.Connection.WithDefaults()
	c.Topology = c.Topology.WithDefaults()
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	p := c.publisher().WithDefaults()
	c.Route, c.Marshaler, c.PublishTimeout, c.PastTolerance = p.Route, p.Marshaler, p.PublishTimeout, p.PastTolerance
	s := c.subscriber().WithDefaults()
	c.Concurrency, c.ShutdownTimeout, c.RequeueDelay = s.Concurrency, s.ShutdownTimeout, s.RequeueDelay
	c.KillMaxAge, c.KillClockSkew = s.KillMaxAge, s.KillClockSkew
	return c
}

// publisher is the configuration of the router's publishers.
func (c Config) publisher() dlx.Config {
	return dlx.Config{
		Connection: c.Connection, Topology: c.Topology, Declare: c.Declare, MeterProvider: c.MeterProvider,
		Route: c.Route, AllowUnroutable: c.AllowUnroutable, Marshaler: c.Marshaler,
		PublishTimeout: c.PublishTimeout, PastTolerance: c.PastTolerance,
	}
}

// subscriber is the configuration of the handlers' subscribers (each sets its HandlerName
// and Concurrency).
func (c Config) subscriber() consumer.Config {
	return consumer.Config{
		Connection: c.Connection, Topology: c.Topology, Queues: c.Declare.Queues, MeterProvider: c.MeterProvider,
		Concurrency: c.Concurrency, Prefetch: c.Prefetch, ShutdownTimeout: c.ShutdownTimeout, Marshaler: c.Marshaler,
		KillSecret: c.KillSecret, KillMaxAge: c.KillMaxAge, KillClockSkew: c.KillClockSkew, OnKill: c.OnKill,
		RequeueDelay: c.RequeueDelay,
	}
}

// Validate reports the first field of c that is not usable, named as the user wrote it
// ("router: Config.Prefetch ..."). No error contains a password of Config.Connection.URL.
func (c Config) Validate() error {
	if err := c.Connection.Validate(); err != nil {
		return fmt.Errorf("router: Config.%w", err)
	}
	if err := c.Topology.Validate(); err != nil {
		return err
	}
	if err := c.Declare.ValidateWith(c.Topology); err != nil {
		return fmt.Errorf("router: Config.Declare: %w", err)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"PublishTimeout", c.PublishTimeout}, {"PastTolerance", c.PastTolerance}} {
		if f.d < 0 {
			return fmt.Errorf("router: Config.%s %s is negative", f.name, f.d)
		}
	}
	if err := consumerconns.ValidateShared(c.subscriber()); err != nil {
		return fmt.Errorf("router: Config.%w", err)
	}
	if err := validRetry("Config.Retry", c.Retry); err != nil {
		return fmt.Errorf("router: %w", err)
	}
	return nil
}

// validConcurrency checks a handler's concurrency, which is also its prefetch (0: default).
func validConcurrency(field string, n int) error {
	if n < 0 || n > 65535 {
		return fmt.Errorf("%s %d is outside 0..65535", field, n)
	}
	return nil
}

// validRetry checks c as a BackoffConfig whose Publisher the router sets, naming the field
// of the router's that holds it: "Config.Retry: middleware: BackoffConfig.MaxAttempts -1 is
// less than 1".
func validRetry(field string, c middleware.BackoffConfig) error {
	if c.Publisher == nil {
		c.Publisher = nonClosing{} // set by the router
	}
	if err := c.Validate(); err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	return nil
}

// validate reports the first field of h that is not usable.
func (h HandlerConfig) validate() error {
	switch {
	case h.Queue == "":
		return errors.New("router: HandlerConfig.Queue is empty")
	case h.Exchange != "" && len(h.Keys) == 0:
		return fmt.Errorf("router: handler %s: HandlerConfig.Keys is empty: Exchange %q is bound to the queue with each key "+
			"(for a fanout exchange, Keys: []string{\"\"})", h.Name, h.Exchange)
	case h.Reply && h.PublishTopic != "":
		return fmt.Errorf("router: handler %s: HandlerConfig.PublishTopic %q is set with Reply: a replying handler's "+
			"messages go to the request's reply-to", h.Name, h.PublishTopic)
	case h.Exchange == "" && len(h.Keys) > 0:
		return fmt.Errorf("router: handler %s: HandlerConfig.Exchange is empty: Keys %q bind the queue to it", h.Name, h.Keys)
	}
	if err := (topology.Topology{Queues: []topology.Queue{{Name: h.Queue}}}).Validate(); err != nil {
		return fmt.Errorf("router: handler %s: HandlerConfig.Queue: %w", h.Name, err)
	}
	if err := validConcurrency("HandlerConfig.Concurrency", h.Concurrency); err != nil {
		return fmt.Errorf("router: handler %s: %w", h.Name, err)
	}
	if h.Retry != nil {
		if err := validRetry("HandlerConfig.Retry", *h.Retry); err != nil {
			return fmt.Errorf("router: handler %s: %w", h.Name, err)
		}
	}
	return nil
}

// HandlerConfig says what a handler consumes and how.
type HandlerConfig struct {
	// Name of the handler; default Queue. Names are unique within a router.
	Name string
	// Queue consumed. Every consumer of a queue, in any process, competes for its
	// messages. Required.
	Queue string
	// Exchange, when set, is bound to Queue with each of Keys: Queue is then a consumer
	// group of that exchange's topic (every group gets every message; a group's consumers
	// compete). An exchange not listed in Config.Declare is of kind Topology.ExchangeKind.
	Exchange string
	Keys     []string
	// Concurrency overrides Config.Concurrency.
	Concurrency int
	// Retry overrides Config.Retry (its Publisher and MeterProvider are the router's too).
	Retry *middleware.BackoffConfig
	// PublishTopic is where the messages the handler returns are published, inside the
	// middleware chain: a failure to publish them is a failure of the handler, retried on its
	// schedule and then poisoned (a message that can never be published, e.g. unroutable, is
	// poisoned at once).
	PublishTopic string
	// Reply makes the handler a request/reply server (see package rpc): the messages it
	// returns are published to the request's reply-to, with its correlation id, inside the
	// middleware chain (a failure to publish them fails the handler; a reply to a caller
	// that is gone is dropped, and the request acked), and a request that is poisoned is
	// answered with an error reply. A request without reply-to gets no reply. PublishTopic must then be empty.
	Reply bool
	// Middleware run inside the default chain, around the handler itself (inside Backoff,
	// Poison and Recoverer: see Router). This is the place of a middleware.Idempotent that
	// makes a business operation happen once per message id (middleware.MessageIDKey) or per
	// key of the handler's own: there "processed" means the handler succeeded, and a failure
	// or a panic gives the key up for the retry.
	Middleware []message.HandlerMiddleware
}

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
	p, err := shared.NewPublisher(config, conn, declare, logger)
	if err != nil {
		return nil, err
	}
	return p.(*dlx.Publisher), nil
}

// allStopped is what Watermill's router logs, as an error, when every handler has stopped
// without a Close: their subscriptions ended.
const allStopped = "All handlers stopped, closing router"

// stopLogger is the logger of Watermill's router. A subscription ends without an error only
// when a kill command drained and deleted its queue (see consumer.Subscriber.Err): when every handler
// stopped that way the stop is deliberate, and allStopped is logged at Info, not as an error.
type stopLogger struct {
	watermill.LoggerAdapter
	r *Router
}

func (l stopLogger) Error(msg string, err error, fields watermill.LogFields) {
	if msg == allStopped && l.r.subsErr() == nil {
		l.Info(msg, fields.Add(watermill.LogFields{"cause": "a kill command deleted every handler's queue"}))
		return
	}
	l.LoggerAdapter.Error(msg, err, fields)
}

func (l stopLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return stopLogger{l.LoggerAdapter.With(fields), l.r}
}

// subsErr reports the subscriptions of the handlers that ended for good (see consumer.Subscriber.Err).
func (r *Router) subsErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	for _, sub := range r.subs {
		err = errors.Join(err, sub.Err())
	}
	return err
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
			warren.StripBookkeeping(c.Metadata)
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

// AddHandler registers fn on h.Queue; the messages fn returns are published to
// h.PublishTopic.
func (r *Router) AddHandler(h HandlerConfig, fn message.HandlerFunc) error {
	if h.Name == "" {
		h.Name = h.Queue
	}
	if err := h.validate(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("router: AddHandler after Close: router is %w", warren.ErrClosed)
	}
	if r.names[h.Name] {
		return fmt.Errorf("router: a handler named %q exists already", h.Name)
	}
	chain, err := r.chain(h)
	if err != nil {
		return fmt.Errorf("router: handler %s: %w", h.Name, err)
	}
	concurrency := h.Concurrency
	if concurrency == 0 {
		concurrency = r.cfg.Concurrency
	}
	scfg := r.cfg.subscriber()
	scfg.Concurrency, scfg.HandlerName = concurrency, h.Name
	s, err := consumerconns.NewSubscriber(scfg, r.logger, r.subConns)
	if err != nil {
		return fmt.Errorf("router: handler %s: %w", h.Name, err)
	}
	sub := s.(*consumer.Subscriber)
	// The chain publishes what fn returns; Watermill's handler gets nothing to publish.
	handle := fn
	for i := len(chain) - 1; i >= 0; i-- {
		handle = chain[i](handle)
	}
	r.wm.AddConsumerHandler(h.Name, h.Queue, sub, func(msg *message.Message) error {
		_, err := handle(msg)
		return err
	})

	r.names[h.Name] = true
	r.subs = append(r.subs, sub)
	r.topo.Queues = append(r.topo.Queues, r.queue(h.Queue))
	if h.Exchange != "" {
		r.topo.Exchanges = append(r.topo.Exchanges, r.exchange(h.Exchange))
		for _, key := range h.Keys {
			r.topo.Bindings = append(r.topo.Bindings, topology.Binding{Exchange: h.Exchange, Queue: h.Queue, Key: key})
		}
	}
	return nil
}

// AddConsumerHandler registers fn, which publishes nothing, on h.Queue.
func (r *Router) AddConsumerHandler(h HandlerConfig, fn message.NoPublishHandlerFunc) error {
	return r.AddHandler(h, func(msg *message.Message) ([]*message.Message, error) {
		return nil, fn(msg)
	})
}

// chain is the default middleware chain (see Router), outermost first.
func (r *Router) chain(h HandlerConfig) ([]message.HandlerMiddleware, error) {
	retry := r.cfg.Retry
	if h.Retry != nil {
		retry = *h.Retry
	}
	retry.Publisher, retry.MeterProvider = r.retryPub, r.cfg.MeterProvider
	backoff, err := middleware.NewBackoff(retry, r.logger)
	if err != nil {
		return nil, err
	}
	var poisonPub message.Publisher = redeclaring{r}
	outputs := publishOutputs(r.pub, h.PublishTopic)
	if h.Reply {
		poisonPub, outputs = errorReplying{r, poisonPub}, r.publishReplies
	}
	poison, err := middleware.NewPoison(middleware.PoisonConfig{Publisher: poisonPub, MeterProvider: r.cfg.MeterProvider}, r.logger)
	if err != nil {
		return nil, err
	}
	var chain []message.HandlerMiddleware
	if r.cfg.CopyStore != nil {
		copies, err := middleware.NewIdempotent(middleware.IdempotentConfig{Store: r.cfg.CopyStore}, r.logger)
		if err != nil {
			return nil, err
		}
		chain = append(chain, copies.Middleware)
	}
	chain = append(chain,
		middleware.RetryCount,
		r.tracing.Middleware,
		poison.Middleware,
		backoff.Middleware,
		r.processMetrics,
		outputs,
		middleware.Recoverer,
	)
	return append(chain, h.Middleware...), nil
}

// processMetrics records messaging.process.duration: how long what is inside it took with a
// message (the handler, publishing its outputs), failed when it returned an error.
func (r *Router) processMetrics(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		start := time.Now()
		out, err := h(msg)
		d, _ := warren.DeliveryFrom(msg.Context())
		r.metrics.Processed(msg.Context(), r.consumes.Get(middleware.ConsumedQueue(msg), d.Exchange), start, err)
		return out, err
	}
}

// publishOutputs publishes the messages the handler returns to topic, inside the chain, and
// returns none: a failure to publish them is the handler's failure (retried, then poisoned;
// poisoned at once when publishing can never succeed).
func publishOutputs(pub message.Publisher, topic string) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err != nil || len(out) == 0 {
				return nil, err
			}
			if topic == "" {
				return nil, warren.Permanent(fmt.Errorf("the handler returned %d messages and its HandlerConfig.PublishTopic is empty", len(out)))
			}
			if err := msg.Context().Err(); err != nil { // shutting down: not published, not acked
				return nil, fmt.Errorf("publish %d messages to %q: %w", len(out), topic, context.Cause(msg.Context()))
			}
			deriveOutputs(msg, out)
			if err := pub.Publish(topic, out...); err != nil {
				return nil, fmt.Errorf("publish %d messages to %q: %w", len(out), topic, err) // permanent if dlx says so
			}
			return nil, nil
		}
	}
}

// deriveOutputs readies the messages out that the handler of msg returned for publishing:
// without bookkeeping (see fresh), within msg's trace and lifetime, with publish ids derived
// from msg's, so that copies of msg make copies of its outputs (recognised in turn).
func deriveOutputs(msg *message.Message, out []*message.Message) {
	for i, o := range out {
		o = fresh(o)
		out[i] = o
		if !trace.SpanContextFromContext(o.Context()).IsValid() {
			o.SetContext(msg.Context())
		}
		if id := middleware.DerivedPublishID(msg, ">"+strconv.Itoa(i)); id != "" && o.Metadata.Get(warren.MetadataPublishID) == "" {
			o.Metadata.Set(warren.MetadataPublishID, id)
		}
	}
}

// redeclaring publishes poison messages: when the broker returns one because the poison queue
// is gone (deleted by someone), it declares the work queue's topology again, which makes the
// poison queue, and publishes once more.
type redeclaring struct{ r *Router }

func (p redeclaring) Publish(topic string, msgs ...*message.Message) error {
	err := p.r.retryPub.Publish(topic, msgs...)
	var ret *dlx.ReturnedError
	queue, isPoison := strings.CutSuffix(topic, topology.PoisonQueue(""))
	if !errors.As(err, &ret) || !isPoison {
		return err
	}
	ctx := context.Background()
	if len(msgs) > 0 {
		ctx = msgs[0].Context()
	}
	if derr := p.r.retries.Declare(ctx, topology.Topology{Queues: []topology.Queue{p.r.queue(queue)}}); derr != nil {
		return errors.Join(err, derr)
	}
	p.r.logger.Info("Poison queue declared again", watermill.LogFields{"queue": topic})
	return p.r.retryPub.Publish(topic, msgs...)
}

func (redeclaring) Close() error { return nil }

// queue is the declaration of queue: as listed in Config.Declare, or with the defaults.
func (r *Router) queue(name string) topology.Queue {
	for _, q := range r.cfg.Declare.Queues {
		if q.Name == name {
			return q
		}
	}
	return topology.Queue{Name: name}
}

func (r *Router) exchange(name string) topology.Exchange {
	for _, e := range r.cfg.Declare.Exchanges {
		if e.Name == name {
			return e
		}
	}
	return topology.Exchange{Name: name}
}

// Run declares the handlers' queues, exchanges and bindings and runs the handlers until ctx
// ends, Close is called or (with Config.HandleSignals) the process gets SIGINT or SIGTERM;
// then it shuts down gracefully (see Close). Run returns an error after Close, and when it
// runs already.
func (r *Router) Run(ctx context.Context) error {
	r.mu.Lock()
	switch {
	case r.closed:
		r.mu.Unlock()
		return fmt.Errorf("router: Run after Close: router is %w", warren.ErrClosed)
	case r.runDone != nil:
		r.mu.Unlock()
		return errors.New("router: Run called twice")
	}
	runDone := make(chan struct{})
	r.runDone = runDone
	topo, subs := r.topo, r.subs
	r.mu.Unlock()

	declareCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // Close ends the declaration
		select {
		case <-r.closing:
			cancel()
		case <-declareCtx.Done():
		}
	}()
	err := r.out.Declare(declareCtx, topo) // retries go to queues that exist
	select {
	case <-r.closing: // closed before the handlers ran
		close(runDone)
		return r.Close()
	default:
	}
	if err != nil { // Run may be called again
		r.mu.Lock()
		r.runDone = nil
		r.mu.Unlock()
		close(runDone)
		return fmt.Errorf("router: %w", err)
	}
	if r.cfg.HandleSignals {
		var stop context.CancelFunc
		ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
	}
	go func() {
		select {
		case <-ctx.Done():
			r.logger.Info("Shutting down", watermill.LogFields{"cause": context.Cause(ctx)})
			_ = r.Close()
		case <-runDone:
		}
	}()
	go func() { // Running: Watermill's handlers run, and every subscription consumes
		select {
		case <-r.wm.Running():
		case <-runDone:
			return
		}
		for _, sub := range subs {
			select {
			case <-sub.Ready():
			case <-runDone:
				return
			}
		}
		close(r.running)
	}()
	// Watermill's router stops its handlers when its context ends, without the graceful
	// close; Close does that, so Watermill's gets a context that does not end.
	err = r.wm.Run(context.WithoutCancel(ctx))
	close(runDone)
	// A queue deleted under its handler: never nil with work left.
	return errors.Join(err, r.Close(), r.subsErr())
}

// Running is closed once the handlers run: every handler's subscription listens to its
// queue's kill topic and consumes (or is paused by a kill command). A message published,
// or a kill sent, after that is seen at once.
func (r *Router) Running() <-chan struct{} { return r.running }

// Close stops every handler from taking messages, waits up to Config.ShutdownTimeout for
// those in flight to be processed and acked, returns the rest to their queues, and closes
// the connections. A message whose handler finished in time is never processed again.
// Close on a router whose handlers never ran closes its connections at once; Close may be
// called more than once.
func (r *Router) Close() error {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		runDone, subs := r.runDone, r.subs
		r.mu.Unlock()
		close(r.closing)

		var err error
		if r.handlersRan(runDone) {
			err = r.wm.Close()
		} else { // Watermill's Close would wait for handlers that never started
			for _, sub := range subs {
				err = errors.Join(err, sub.Close())
			}
		}
		// The subscribers are closed: their connections go, then the publishers' one.
		r.closeErr = errors.Join(err, r.subConns.Close(), r.out.Close(), r.retries.Close(), r.direct.Close(), r.pubConn.Close())
	})
	return r.closeErr
}

// handlersRan reports whether Watermill's router started the handlers, waiting for a Run
// that is starting them (runDone is nil if Run was never called).
func (r *Router) handlersRan(runDone chan struct{}) bool {
	if runDone == nil {
		return false
	}
	select {
	case <-r.wm.Running():
		return true
	case <-runDone:
		select {
		case <-r.wm.Running():
			return true
		default:
			return false
		}
	}
}

// nonClosing shields a shared publisher from Watermill's handler, which closes its
// publisher when it stops.
type nonClosing struct{ message.Publisher }

func (nonClosing) Close() error { return nil }
