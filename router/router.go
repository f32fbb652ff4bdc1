package router

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/topology"
)

// Config configures a Router.
type Config struct {
	// URL of the broker. Required.
	URL string
	// Topology configures the builder (queue type, delivery limit, delay levels).
	Topology topology.Config
	// Declare is declared when the router runs, before the handlers' own queues and
	// bindings. A handler's queue listed here is declared as listed (type, delivery limit).
	Declare topology.Topology
	// Route maps the topics of Publisher and of the messages handlers return to their
	// destination. Default dlx.ToQueue.
	Route func(topic string) dlx.Route
	// Concurrency is how many messages each handler processes at once, unless the handler
	// says otherwise; the prefetch matches it. Default 64.
	Concurrency int
	// Retry is the retry schedule of handlers that do not set one (its Publisher is set by
	// the router). Default: exponential from 1s, doubling, capped at 5m, 5 attempts.
	Retry middleware.BackoffConfig
	// ShutdownTimeout bounds how long Close waits for the messages in flight. Default 30s.
	ShutdownTimeout time.Duration
	// ConnectTimeout and PublishTimeout bound the broker calls, retries included.
	// Default 30s each.
	ConnectTimeout time.Duration
	PublishTimeout time.Duration
	// TracerProvider traces publishing and processing. Default: otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// IgnoreSignals keeps Run from stopping on SIGINT and SIGTERM.
	IgnoreSignals bool
	// KillSecret, when set, makes handlers obey only kill commands signed with it (see
	// Killer); unsigned, wrongly signed and stale ones are refused and logged.
	KillSecret []byte
	// KillMaxAge bounds the age of a signed kill command, against replays. Default 1m.
	KillMaxAge time.Duration
	// OnKill, when set, is told what each handler does about the kill topic: stopped,
	// resumed, draining, deleted, or refused.
	OnKill func(KillEvent)
}

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	c.Topology = c.Topology.WithDefaults()
	if c.Route == nil {
		c.Route = dlx.ToQueue
	}
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = 30 * time.Second
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = 30 * time.Second
	}
	return c
}

// Validate reports the first field of c that is not usable.
func (c Config) Validate() error {
	if c.URL == "" {
		return errors.New("router: Config.URL is empty")
	}
	if c.Concurrency < 0 {
		return fmt.Errorf("router: Config.Concurrency %d is negative", c.Concurrency)
	}
	if c.ShutdownTimeout < 0 {
		return fmt.Errorf("router: Config.ShutdownTimeout %s is negative", c.ShutdownTimeout)
	}
	if err := c.Declare.Validate(); err != nil {
		return fmt.Errorf("router: Config.Declare: %w", err)
	}
	return c.Topology.Validate()
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
	// Retry overrides Config.Retry.
	Retry *middleware.BackoffConfig
	// PublishTopic is where the messages the handler returns are published.
	PublishTopic string
	// Middleware run inside the default chain, around the handler itself.
	Middleware []message.HandlerMiddleware
}

// Router runs handlers on RabbitMQ queues on top of Watermill's message.Router, with warren's
// default middleware chain on every handler, in this order (outermost first):
//
//  1. middleware.RetryCount: the attempt number, from warren's header, for all below;
//  2. Tracing.Middleware: the consumer span, around everything below, so that retries and
//     poison messages are published inside it and stay in the same trace;
//  3. Poison: whatever is given up on goes to the queue's poison queue, with the reason,
//     and is acked;
//  4. Backoff: a failure is republished to the queue with the next attempt's delay, and
//     acked; a permanent error or the last attempt's failure goes on to Poison;
//  5. middleware.Recoverer: a panic becomes an error, with its stack;
//  6. the handler's own Middleware, then the handler.
//
// Publishing (Publisher, and the messages handlers return) goes through warren's DLX
// publisher, traced.
type Router struct {
	cfg      Config
	logger   watermill.LoggerAdapter
	wm       *message.Router
	tracing  *middleware.Tracing
	out      *dlx.Publisher // Publisher and handler outputs, routed by Config.Route
	retries  *dlx.Publisher // retries and poison messages, routed to queues
	pub      message.Publisher
	retryPub message.Publisher

	mu        sync.Mutex
	topo      topology.Topology // the handlers' queues, exchanges and bindings
	names     map[string]bool
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
	wm, err := message.NewRouter(message.RouterConfig{CloseTimeout: config.ShutdownTimeout + 5*time.Second}, logger)
	if err != nil {
		return nil, err
	}
	tracing, err := middleware.NewTracing(middleware.TracingConfig{TracerProvider: config.TracerProvider})
	if err != nil {
		return nil, err
	}
	pcfg := dlx.Config{
		URL: config.URL, Topology: config.Topology, Declare: config.Declare, Route: config.Route,
		ConnectTimeout: config.ConnectTimeout, PublishTimeout: config.PublishTimeout,
	}
	out, err := dlx.NewPublisher(pcfg, logger)
	if err != nil {
		return nil, err
	}
	pcfg.Route, pcfg.Declare = retryRoute, topology.Topology{}
	retries, err := dlx.NewPublisher(pcfg, logger)
	if err != nil {
		_ = out.Close()
		return nil, err
	}
	return &Router{
		cfg: config, logger: logger, wm: wm, tracing: tracing,
		out: out, retries: retries,
		pub:      tracing.Publisher(out),
		retryPub: tracing.Publisher(retries),
		names:    map[string]bool{},
	}, nil
}

// retryRoute sends retries to the queue named by the topic, and poison messages to the
// poison queue. Both exist: the message was consumed from the one, declared with the other.
func retryRoute(topic string) dlx.Route {
	r := dlx.ToQueue(topic)
	r.Declared = true
	return r
}

// Publisher publishes through warren's DLX publisher (delays, confirms), traced, to the
// destinations of Config.Route. Closing it does nothing: the router closes it.
func (r *Router) Publisher() message.Publisher { return nonClosing{r.pub} }

// AddHandler registers fn on h.Queue; the messages fn returns are published to
// h.PublishTopic.
func (r *Router) AddHandler(h HandlerConfig, fn message.HandlerFunc) error {
	if h.Queue == "" {
		return errors.New("router: HandlerConfig.Queue is empty")
	}
	if h.Name == "" {
		h.Name = h.Queue
	}
	if h.Concurrency < 0 {
		return fmt.Errorf("router: handler %s: HandlerConfig.Concurrency %d is negative", h.Name, h.Concurrency)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
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
	sub, err := NewSubscriber(SubscriberConfig{
		URL: r.cfg.URL, Topology: r.cfg.Topology, Queues: r.cfg.Declare.Queues,
		Concurrency: concurrency, ShutdownTimeout: r.cfg.ShutdownTimeout,
		ConnectTimeout: r.cfg.ConnectTimeout, HandlerName: h.Name,
		KillSecret: r.cfg.KillSecret, KillMaxAge: r.cfg.KillMaxAge, OnKill: r.cfg.OnKill,
	}, r.logger)
	if err != nil {
		return fmt.Errorf("router: handler %s: %w", h.Name, err)
	}
	handler := r.wm.AddHandler(h.Name, h.Queue, sub, h.PublishTopic, nonClosing{r.pub}, fn)
	handler.AddMiddleware(chain...)

	r.names[h.Name] = true
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
	retry.Publisher = r.retryPub
	backoff, err := middleware.NewBackoff(retry, r.logger)
	if err != nil {
		return nil, err
	}
	poison, err := middleware.NewPoison(middleware.PoisonConfig{Publisher: r.retryPub}, r.logger)
	if err != nil {
		return nil, err
	}
	chain := []message.HandlerMiddleware{
		middleware.RetryCount,
		r.tracing.Middleware,
		poison.Middleware,
		backoff.Middleware,
		middleware.Recoverer,
	}
	return append(chain, h.Middleware...), nil
}

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
// ends, Close is called or (unless Config.IgnoreSignals) the process gets SIGINT or SIGTERM;
// then it shuts down gracefully (see Close).
func (r *Router) Run(ctx context.Context) error {
	r.mu.Lock()
	topo := r.topo
	r.mu.Unlock()
	if err := r.out.Declare(ctx, topo); err != nil { // retries go to queues that exist
		return fmt.Errorf("router: %w", err)
	}
	if !r.cfg.IgnoreSignals {
		var stop context.CancelFunc
		ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
	}
	runDone := make(chan struct{})
	defer close(runDone)
	go func() {
		select {
		case <-ctx.Done():
			r.logger.Info("Shutting down", watermill.LogFields{"cause": context.Cause(ctx)})
			_ = r.Close()
		case <-runDone:
		}
	}()
	// Watermill's router stops its handlers when its context ends, without the graceful
	// close; Close does that, so Watermill's gets a context that does not end.
	err := r.wm.Run(context.WithoutCancel(ctx))
	return errors.Join(err, r.Close())
}

// Running is closed once the handlers run.
func (r *Router) Running() chan struct{} { return r.wm.Running() }

// Close stops every handler from taking messages, waits up to Config.ShutdownTimeout for
// those in flight to be processed and acked, returns the rest to their queues, and closes
// the connections. A message whose handler finished in time is never processed again.
func (r *Router) Close() error {
	r.closeOnce.Do(func() {
		r.closeErr = errors.Join(r.wm.Close(), r.out.Close(), r.retries.Close())
	})
	return r.closeErr
}

// nonClosing shields a shared publisher from Watermill's handler, which closes its
// publisher when it stops.
type nonClosing struct{ message.Publisher }

func (nonClosing) Close() error { return nil }
