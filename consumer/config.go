package consumer

import (
	"fmt"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/topology"
)

// Config configures a Subscriber.
type Config struct {
	// Connection says how to reach the broker (URL required); its ConnectTimeout bounds
	// connecting and declaring in Subscribe.
	Connection warren.Connection
	// Topology configures the builder that declares the queues subscribed to.
	Topology topology.Config
	// Queues lists queues with options of their own (type, delivery limit); any other
	// queue subscribed to is declared as a work queue with the defaults.
	Queues []topology.Queue
	// Concurrency is how many messages of one subscription are handed out at once: Watermill's
	// router processes each in a goroutine of its own. Default 64.
	Concurrency int
	// Prefetch is how many messages the broker sends ahead of their acks (basic.qos), at least
	// Concurrency: the ones not handed out yet wait in the subscriber, and go back to the
	// queue when it stops. A quorum queue delivers faster with more outstanding. Default
	// 4×Concurrency, at most 65535. Messages are handed out in order only with Concurrency 1
	// and Prefetch 1 (a nacked message goes back behind those prefetched).
	Prefetch int
	// ShutdownTimeout bounds how long closing waits for the messages handed out to be
	// acked. Default 30s.
	ShutdownTimeout time.Duration
	// Marshaler defaults to warren.Marshaler{}. A delivery it cannot unmarshal goes to the
	// poison queue with the reason.
	Marshaler wamqp.Marshaler
	// HandlerName is recorded in the poison headers of deliveries that cannot be
	// unmarshaled, and in kill events.
	HandlerName string
	// KillSecret, when set, makes the subscriber obey only kill commands signed with it
	// (see kill.Killer); others are refused and logged.
	KillSecret []byte
	// KillMaxAge bounds the age of a kill command received, against replays. Default 1m.
	KillMaxAge time.Duration
	// KillClockSkew is how far ahead of this clock a kill command may be dated; one dated
	// further ahead is refused. Default 5s.
	KillClockSkew time.Duration
	// OnKill, when set, is told what each subscription does about the kill topic.
	OnKill func(KillEvent)
	// GoOnAfterPoison, in a lane of a queue ordered by key (topology.Queue.Lanes), goes on
	// with a key's next message once one is poisoned. By default the key is held: its later
	// messages wait, parked on the broker, until an operator releases or skips them
	// (docs/ordering.md).
	GoOnAfterPoison bool
	// RequeueDelay is how long a message that is nacked (a handler error that is not retried
	// or poisoned, e.g. its retry could not be published) waits before it goes back to the
	// queue, so that nothing is redelivered in a hot loop. Not when the subscriber closes.
	// Default 1s.
	RequeueDelay time.Duration
	// MeterProvider records the subscriber's metrics: messaging.client.consumed.messages,
	// warren.delay.lateness, warren.kill.events, and warren.messages.poisoned for the
	// deliveries it poisons itself (see the README's Metrics). Default:
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	c.Connection = c.Connection.WithDefaults()
	c.Topology = c.Topology.WithDefaults()
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Prefetch == 0 {
		c.Prefetch = min(DefaultPrefetchPerHandler*c.Concurrency, 65535)
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Marshaler == nil {
		c.Marshaler = warren.Marshaler{}
	}
	if c.KillMaxAge == 0 {
		c.KillMaxAge = DefaultKillMaxAge
	}
	if c.RequeueDelay == 0 {
		c.RequeueDelay = DefaultRequeueDelay
	}
	if c.KillClockSkew == 0 {
		c.KillClockSkew = DefaultKillClockSkew
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	return c
}

// Defaults of Config.
const (
	DefaultConcurrency = 64
	// DefaultPrefetchPerHandler times Concurrency is the default Prefetch (at most 65535).
	DefaultPrefetchPerHandler = 4
	DefaultShutdownTimeout    = 30 * time.Second
	DefaultKillMaxAge         = time.Minute
	DefaultKillClockSkew      = 5 * time.Second
	DefaultRequeueDelay       = time.Second
)

// Validate reports the first field of c that is not usable. No error contains a password
// of Config.Connection.URL.
func (c Config) Validate() error {
	if err := c.Connection.Validate(); err != nil {
		return fmt.Errorf("consumer: Config.%w", err)
	}
	if err := c.ValidateShared(); err != nil {
		return fmt.Errorf("consumer: Config.%w", err)
	}
	if err := c.Topology.Validate(); err != nil {
		return err
	}
	return topology.Topology{Queues: c.Queues}.ValidateWith(c.Topology)
}

// ValidateShared checks the fields of c that a router's Config has too (Concurrency,
// Prefetch and the durations), naming each bare ("Concurrency ..."), for the caller to say
// whose it is: Validate says "consumer: Config.", router.Config.Validate "router: Config.".
func (c Config) ValidateShared() error {
	if c.Concurrency < 0 || c.Concurrency > 65535 {
		return fmt.Errorf("%s %d is outside 1..65535", "Concurrency", c.Concurrency)
	}
	if c.Prefetch < 0 || c.Prefetch > 65535 || c.Prefetch > 0 && c.Prefetch < c.WithDefaults().Concurrency {
		return fmt.Errorf("%s %d is outside Concurrency..65535", "Prefetch", c.Prefetch)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"ShutdownTimeout", c.ShutdownTimeout}, {"KillMaxAge", c.KillMaxAge},
		{"KillClockSkew", c.KillClockSkew}, {"RequeueDelay", c.RequeueDelay}} {
		if f.d < 0 {
			return fmt.Errorf("%s %s is negative", f.name, f.d)
		}
	}
	return nil
}
