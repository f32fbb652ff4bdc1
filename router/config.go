package router

import (
	"fmt"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/consumer"
	"github.com/warrenmq/warren/dlx"
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
	if err := c.subscriber().ValidateShared(); err != nil {
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
