package dlx

import (
	"fmt"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/due"
	"github.com/warrenmq/warren/topology"
)

// Route is where a topic is published: an exchange and a routing key. The default exchange
// ("") with a queue's name as the routing key addresses that queue.
type Route struct {
	Exchange   string
	RoutingKey string
	// Declared says the destination exists already and must not be declared by the
	// publisher (a poison queue, declared with its work queue).
	Declared bool
}

// ToQueue routes topic to the work queue of the same name. It is the default.
func ToQueue(topic string) Route { return Route{RoutingKey: topic} }

// ToExchange routes every topic to exchange, with the topic as the routing key (for a topic
// exchange such as "events", publish to "order.created").
func ToExchange(exchange string) func(topic string) Route {
	return func(topic string) Route { return Route{Exchange: exchange, RoutingKey: topic} }
}

// ExchangePerTopic routes topic to the exchange of the same name with an empty routing key
// (watermill-amqp's pub/sub layout).
func ExchangePerTopic(topic string) Route { return Route{Exchange: topic} }

// Config configures a Publisher.
type Config struct {
	// Connection says how to reach the broker (URL required); its ConnectTimeout bounds
	// connecting and declaring, retries included.
	Connection warren.Connection
	// Topology configures the builder, including the layout of the delay levels.
	Topology topology.Config
	// Declare is declared when the publisher starts, after the delay levels. Destinations
	// listed here are declared as listed; others on their first publish, a queue as a work
	// queue and an exchange of kind Topology.ExchangeKind.
	Declare topology.Topology
	// Route maps a topic to its destination. Default ToQueue.
	Route func(topic string) Route
	// AllowUnroutable publishes without the mandatory flag: a message no queue takes is then
	// dropped by the broker instead of failing Publish.
	AllowUnroutable bool
	// Marshaler defaults to warren.Marshaler{}.
	Marshaler wamqp.Marshaler
	// PublishTimeout bounds one call of Publish, retries included. Default 30s.
	PublishTimeout time.Duration
	// PastTolerance is how far in the past a DeliverAt time may lie (it is then delivered
	// at once) before it is an error. Default 1s.
	PastTolerance time.Duration
	// MeterProvider records the publisher's metrics: messaging.client.sent.messages and
	// messaging.client.operation.duration per Publish call, and the gauge
	// warren.delay.parked (see the README's Metrics). Default: otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// Defaults of Config.
const (
	DefaultPublishTimeout = 30 * time.Second
	DefaultPastTolerance  = due.DefaultPastTolerance
)

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	c.Connection = c.Connection.WithDefaults()
	c.Topology = c.Topology.WithDefaults()
	if c.Route == nil {
		c.Route = ToQueue
	}
	if c.Marshaler == nil {
		c.Marshaler = warren.Marshaler{}
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.PastTolerance == 0 {
		c.PastTolerance = DefaultPastTolerance
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	return c
}

// Validate reports the first field of c that is not usable. No error contains a password
// of Config.Connection.URL.
func (c Config) Validate() error {
	if err := c.Connection.Validate(); err != nil {
		return fmt.Errorf("dlx: Config.%w", err)
	}
	if err := c.Topology.Validate(); err != nil {
		return err
	}
	if err := c.Declare.ValidateWith(c.Topology); err != nil {
		return fmt.Errorf("dlx: Config.Declare: %w", err)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"PublishTimeout", c.PublishTimeout}, {"PastTolerance", c.PastTolerance}} {
		if f.d < 0 {
			return fmt.Errorf("dlx: Config.%s %s is negative", f.name, f.d)
		}
	}
	return nil
}
