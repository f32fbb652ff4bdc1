// Package telemetry is warren's set of OpenTelemetry metric instruments, in one place: the
// four of the messaging semantic conventions (messaging.client.sent.messages,
// messaging.client.consumed.messages, messaging.client.operation.duration,
// messaging.process.duration) and warren's own (warren.*). The packages that record them
// (dlx, middleware, router) create an Instruments from their config's MeterProvider, and ops
// its redrives counter (NewRedrives); docs/metrics.md lists every instrument, its attributes
// and where it is recorded.
//
// The hot path records with attribute sets and options built ahead (see Publish and Consume,
// cached per destination); failures, retries, poisonings and kill events build their
// attributes when they happen.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/warrenmq/warren/internal/contract"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/semconv/v1.40.0/messagingconv"
)

// ScopeName is the instrumentation scope of every instrument warren creates.
const ScopeName = "github.com/warrenmq/warren"

// Names of warren's own instruments.
const (
	NameRetries    = "warren.retries.scheduled"
	NamePoisoned   = "warren.messages.poisoned"
	NameLateness   = "warren.delay.lateness"
	NameParked     = "warren.delay.parked"
	NameKillEvents = "warren.kill.events"
	NameRedrives   = "warren.redrives"
)

// Attribute keys of warren's own instruments.
const (
	QueueKey   = attribute.Key("warren.queue")          // the work queue (or parking queue) concerned
	AttemptKey = attribute.Key("warren.attempt")        // the attempt a retry is scheduled for (2 for the first retry)
	ReasonKey  = attribute.Key("warren.poison.reason")  // warren.PoisonReason* values
	ActionKey  = attribute.Key("warren.kill.action")    // stop, delete, resume
	StateKey   = attribute.Key("warren.kill.state")     // stopped, resumed, draining, deleted, refused
	SourceKey  = attribute.Key("warren.redrive.source") // where redriven messages come from: poison, parked
)

// Operation names recorded with the messaging conventions: "send" for a publish, "process"
// for a message handed to a handler (warren's consumer spans use the same names).
const (
	OperationSend    = "send"
	OperationProcess = "process"
)

// durationBuckets are the bucket boundaries the messaging conventions ask for on their
// duration histograms, in seconds.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// latenessBuckets resolve lateness from a millisecond (a delay level hop costs about that:
// docs/decisions.md) to minutes (a quorum level's dead-letter worker resends after 180 s by default).
var latenessBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 180, 600}

// Instruments are warren's instruments, created from one MeterProvider.
type Instruments struct {
	meter metric.Meter

	sent      metric.Int64Counter
	consumed  metric.Int64Counter
	operation metric.Float64Histogram
	process   metric.Float64Histogram

	retries  metric.Int64Counter
	poisoned metric.Int64Counter
	lateness metric.Float64Histogram
	kills    metric.Int64Counter
}

// Meter returns the meter of mp (otel.GetMeterProvider() when nil) for warren's scope.
func Meter(mp metric.MeterProvider) metric.Meter {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return mp.Meter(ScopeName, metric.WithSchemaURL(semconv.SchemaURL))
}

// New creates the instruments from mp; nil means otel.GetMeterProvider().
func New(mp metric.MeterProvider) (*Instruments, error) {
	m := Meter(mp)
	i := &Instruments{meter: m}
	var errs []error
	add := func(err error) { errs = append(errs, err) }

	sent, err := messagingconv.NewClientSentMessages(m)
	i.sent = sent.Inst()
	add(err)
	consumed, err := messagingconv.NewClientConsumedMessages(m)
	i.consumed = consumed.Inst()
	add(err)
	operation, err := messagingconv.NewClientOperationDuration(m, metric.WithExplicitBucketBoundaries(durationBuckets...))
	i.operation = operation.Inst()
	add(err)
	process, err := messagingconv.NewProcessDuration(m, metric.WithExplicitBucketBoundaries(durationBuckets...))
	i.process = process.Inst()
	add(err)

	i.retries, err = m.Int64Counter(NameRetries, metric.WithUnit("{message}"),
		metric.WithDescription("Failed messages republished for a later attempt (by middleware.Backoff)."))
	add(err)
	i.poisoned, err = m.Int64Counter(NamePoisoned, metric.WithUnit("{message}"),
		metric.WithDescription("Messages given up on and sent to their queue's poison queue (or rejected into its dead-letter path)."))
	add(err)
	i.lateness, err = m.Float64Histogram(NameLateness, metric.WithUnit("s"),
		metric.WithDescription("How late a delayed message reached its consumer, after the time it was due."),
		metric.WithExplicitBucketBoundaries(latenessBuckets...))
	add(err)
	i.kills, err = m.Int64Counter(NameKillEvents, metric.WithUnit("{event}"),
		metric.WithDescription("What consumers did about commands of their queue's kill topic."))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("telemetry: create instruments: %w", err)
	}
	return i, nil
}

// Publish holds the attributes of one publish destination, and the options that record
// them without an error, built ahead: passing a slice made once allocates nothing.
type Publish struct {
	attrs     []attribute.KeyValue
	sent      []metric.AddOption    // messaging.client.sent.messages
	operation []metric.RecordOption // messaging.client.operation.duration
}

// NewPublish returns the attribute sets of a publish to exchange with routingKey. Following
// the RabbitMQ conventions messaging.destination.name is the exchange ("" for the default
// exchange); a publish to the default exchange, which addresses a queue, also records the
// queue as messaging.rabbitmq.destination.routing_key (a queue name is of low cardinality,
// the routing key of a topic exchange may not be, and is left out).
func NewPublish(exchange, routingKey string) *Publish {
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemRabbitMQ,
		semconv.MessagingOperationName(OperationSend),
		semconv.MessagingDestinationName(exchange),
	}
	if exchange == "" {
		attrs = append(attrs, semconv.MessagingRabbitMQDestinationRoutingKey(routingKey))
	}
	return &Publish{
		attrs:     attrs,
		sent:      []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attrs...))},
		operation: []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(with(attrs, semconv.MessagingOperationTypeSend)...))},
	}
}

// with returns attrs followed by more, in a new slice.
func with(attrs []attribute.KeyValue, more ...attribute.KeyValue) []attribute.KeyValue {
	return append(attrs[:len(attrs):len(attrs)], more...)
}

// Published records one publish call that began at start: sent messages the broker took and
// failed ones it did not (error.type from err), and the call's duration, failed if err is set.
func (i *Instruments) Published(ctx context.Context, p *Publish, start time.Time, sent, failed int, err error) {
	elapsed := time.Since(start).Seconds()
	if sent > 0 {
		i.sent.Add(ctx, int64(sent), p.sent...)
	}
	if err == nil {
		i.operation.Record(ctx, elapsed, p.operation...)
		return
	}
	e := semconv.ErrorTypeKey.String(contract.ErrorType(err))
	if failed > 0 {
		i.sent.Add(ctx, int64(failed), metric.WithAttributes(with(p.attrs, e)...))
	}
	i.operation.Record(ctx, elapsed, metric.WithAttributes(with(p.attrs, semconv.MessagingOperationTypeSend, e)...))
}

// Consume holds the attributes of the messages consumed from one queue that were published
// to one exchange, and the options that record them without an error, built ahead.
type Consume struct {
	attrs    []attribute.KeyValue
	consumed []metric.AddOption    // messaging.client.consumed.messages
	process  []metric.RecordOption // messaging.process.duration
}

// NewConsume returns the attribute sets of messages consumed from queue that were published
// to exchange ("" for the default exchange, which retries come through; for a message that
// came through the delay levels, its destination exchange). The queue is the consumer group:
// every consumer of it competes for its messages, and every queue bound to an exchange gets
// each of its messages.
func NewConsume(queue, exchange string) *Consume {
	attrs := []attribute.KeyValue{
		semconv.MessagingSystemRabbitMQ,
		semconv.MessagingOperationName(OperationProcess),
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingDestinationName(exchange),
		semconv.MessagingConsumerGroupName(queue),
	}
	set := metric.WithAttributeSet(attribute.NewSet(attrs...))
	return &Consume{attrs: attrs, consumed: []metric.AddOption{set}, process: []metric.RecordOption{set}}
}

// Consumed records a message handed to the application.
func (i *Instruments) Consumed(ctx context.Context, c *Consume) {
	i.consumed.Add(ctx, 1, c.consumed...)
}

// Processed records how long the handler took with a message since start, failed if err is
// set.
func (i *Instruments) Processed(ctx context.Context, c *Consume, start time.Time, err error) {
	elapsed := time.Since(start).Seconds()
	if err == nil {
		i.process.Record(ctx, elapsed, c.process...)
		return
	}
	i.process.Record(ctx, elapsed, metric.WithAttributes(with(c.attrs, semconv.ErrorTypeKey.String(contract.ErrorType(err)))...))
}

// Consumes caches the Consume of each (queue, exchange); safe for concurrent use.
type Consumes struct {
	mu sync.RWMutex
	m  map[[2]string]*Consume
}

// Get returns the Consume of queue and exchange, made on first use.
func (c *Consumes) Get(queue, exchange string) *Consume {
	k := [2]string{queue, exchange}
	c.mu.RLock()
	v := c.m[k]
	c.mu.RUnlock()
	if v != nil {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if v = c.m[k]; v == nil {
		if c.m == nil {
			c.m = map[[2]string]*Consume{}
		}
		v = NewConsume(queue, exchange)
		c.m[k] = v
	}
	return v
}

// RetryScheduled records a retry of a message of queue, scheduled for attempt.
func (i *Instruments) RetryScheduled(ctx context.Context, queue string, attempt int) {
	i.retries.Add(ctx, 1, metric.WithAttributes(QueueKey.String(queue), AttemptKey.Int(attempt)))
}

// Poisoned records a message of queue given up on for reason (a warren.PoisonReason*).
func (i *Instruments) Poisoned(ctx context.Context, queue, reason string) {
	i.poisoned.Add(ctx, 1, metric.WithAttributes(QueueKey.String(queue), ReasonKey.String(reason)))
}

// Late records that a delayed message, due at due, was consumed at now, with opts (the
// QueueOptions of the queue it was consumed from). A message
// that seems early (the publisher's clock ahead of this one: warren never delivers early)
// counts as on time.
func (i *Instruments) Late(ctx context.Context, opts []metric.RecordOption, due, now time.Time) {
	i.lateness.Record(ctx, max(now.Sub(due), 0).Seconds(), opts...)
}

// QueueOptions records the attributes of warren's instruments about queue alone.
func QueueOptions(queue string) []metric.RecordOption {
	return []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(QueueKey.String(queue)))}
}

// KillEvent records what a consumer of queue did (state) about a kill command (action; ""
// when unknown).
func (i *Instruments) KillEvent(ctx context.Context, queue, action, state string) {
	i.kills.Add(ctx, 1, metric.WithAttributes(QueueKey.String(queue), ActionKey.String(action), StateKey.String(state)))
}

// Parked registers the observable gauge warren.delay.parked: at every collection, count
// returns the number of messages in the parking queue named queue, or ok false when it cannot
// tell (not connected); nothing is then reported. Unregister it when the counting ends.
func (i *Instruments) Parked(queue string, count func(context.Context) (n int64, ok bool)) (metric.Registration, error) {
	g, err := i.meter.Int64ObservableGauge(NameParked, metric.WithUnit("{message}"),
		metric.WithDescription("Delayed messages waiting in the parking queue: their destination did not exist when they were due."))
	if err != nil {
		return nil, fmt.Errorf("telemetry: %s: %w", NameParked, err)
	}
	set := metric.WithAttributeSet(attribute.NewSet(QueueKey.String(queue)))
	reg, err := i.meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if n, ok := count(ctx); ok {
			o.ObserveInt64(g, n, set)
		}
		return nil
	}, g)
	if err != nil {
		return nil, fmt.Errorf("telemetry: %s: %w", NameParked, err)
	}
	return reg, nil
}
