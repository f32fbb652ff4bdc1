package middleware

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v4"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/telemetry"
)

// BackoffConfig configures Backoff. A schedule is either the explicit list Delays or, when
// Delays is empty, exponential from Initial, times Multiplier, capped at Max, with Jitter.
type BackoffConfig struct {
	// Publisher republishes a failed message to the queue it was consumed from, with a
	// delay: warren's *dlx.Publisher routing topics to queues (dlx.ToQueue), possibly
	// decorated (tracing). NewBackoff refuses nil. In router.Config.Retry and
	// HandlerConfig.Retry leave it nil: the router sets its own retry publisher, in place of
	// any set there.
	Publisher message.Publisher
	// Delays is an explicit schedule: Delays[0] is the wait before attempt 2, Delays[1]
	// before attempt 3, and so on; the last one repeats if MaxAttempts is larger.
	Delays []time.Duration
	// Initial is the first wait of the exponential schedule. Default 1s.
	Initial time.Duration
	// Multiplier of the exponential schedule. Default 2.
	Multiplier float64
	// Max caps the exponential schedule. Default 5m.
	Max time.Duration
	// Jitter randomises each exponential wait by ±Jitter·wait (0 to 1). Default 0.
	Jitter float64
	// MaxAttempts counts every attempt, the first included: past it, the message is given up
	// (to the poison queue, when Poison is outside Backoff). Default len(Delays)+1 for an
	// explicit schedule, 5 for an exponential one.
	MaxAttempts int
	// Queue names the queue msg was consumed from, which the retry is published to. Default:
	// the queue of warren.DeliveryFrom, else Watermill's subscribe topic (which is the queue
	// with watermill-amqp's queue-per-topic configs).
	Queue func(msg *message.Message) string
	// InPlace retries a failed message where it is, instead of through the delay levels: the
	// message stays unacknowledged, and after the schedule's wait the handler runs again
	// with it, as the next attempt. A handler whose messages keep an order needs it (a router
	// sets it for HandlerConfig.Lanes): a message published again would come after the ones
	// behind it. The broker holds the message meanwhile; a consumer that dies returns it to
	// its queue. The waits add up while the message is unacknowledged: keep their total below
	// the broker's consumer timeout (30 minutes by default). Publisher is not used.
	InPlace bool
	// MeterProvider counts the retries scheduled (warren.retries.scheduled, by queue and
	// attempt). Default: otel.GetMeterProvider(). A router sets its own
	// (router.Config.MeterProvider) in place of this one.
	MeterProvider metric.MeterProvider
}

// Defaults of BackoffConfig's exponential schedule.
const (
	DefaultBackoffInitial     = time.Second
	DefaultBackoffMultiplier  = 2
	DefaultBackoffMax         = 5 * time.Minute
	DefaultBackoffMaxAttempts = 5 // for an explicit schedule: len(Delays)+1
)

// WithDefaults returns c with every unset field set to its default.
func (c BackoffConfig) WithDefaults() BackoffConfig {
	if c.Initial == 0 {
		c.Initial = DefaultBackoffInitial
	}
	if c.Multiplier == 0 {
		c.Multiplier = DefaultBackoffMultiplier
	}
	if c.Max == 0 {
		c.Max = DefaultBackoffMax
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultBackoffMaxAttempts
		if len(c.Delays) > 0 {
			c.MaxAttempts = len(c.Delays) + 1
		}
	}
	if c.Queue == nil {
		c.Queue = ConsumedQueue
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	return c
}

// Validate reports the first field of c that is not usable.
func (c BackoffConfig) Validate() error {
	c = c.WithDefaults()
	switch {
	case c.Publisher == nil:
		return errors.New("middleware: BackoffConfig.Publisher is nil")
	case c.MaxAttempts < 1:
		return fmt.Errorf("middleware: BackoffConfig.MaxAttempts %d is less than 1", c.MaxAttempts)
	case c.Initial < 0:
		return fmt.Errorf("middleware: BackoffConfig.Initial %s is negative", c.Initial)
	case c.Max < c.Initial:
		return fmt.Errorf("middleware: BackoffConfig.Max %s is less than Initial %s", c.Max, c.Initial)
	case c.Multiplier < 1:
		return fmt.Errorf("middleware: BackoffConfig.Multiplier %g is less than 1", c.Multiplier)
	case c.Jitter < 0 || c.Jitter > 1:
		return fmt.Errorf("middleware: BackoffConfig.Jitter %g is outside 0..1", c.Jitter)
	}
	for i, d := range c.Delays {
		if d < 0 {
			return fmt.Errorf("middleware: BackoffConfig.Delays[%d] %s is negative", i, d)
		}
	}
	return nil
}

// Backoff retries a failed message later, with a wait per attempt. When the handler fails,
// Backoff republishes a copy of the message, through the DLX publisher, to the queue that
// failed (not to its exchange: other consumer groups of a fan-out topic never see the retry),
// with the attempt number plus one and the delay the schedule gives for that attempt, and
// then acks the original. A permanent error (see Permanent), or a failure of the last
// attempt, is returned unchanged for the Poison middleware outside it.
//
// Two failures are not the handler's and are returned as a *RequeueError, which Poison
// passes on and the subscriber requeues: a retry that could not be published (the broker did
// not take it; a retry that can never be published, too large for a frame, is a permanent
// error instead), and an error while the message's context has ended (the consumer is
// shutting down: the message goes back to the queue once, it is neither retried nor
// poisoned).
//
// An attempt header that is not a number in 1..MaxAttempts (foreign or forged) counts as
// attempt 1, and is logged.
//
// A retry keeps the body, headers and UUID, and records in its attempt bookkeeping (see
// warren.AttemptRecord) when the first attempt failed and where the message was first
// published to, for the poison queue, and the queue it retries in: warren's subscriber
// believes the attempt number only on a retry of the queue it consumes.
type Backoff struct {
	cfg     BackoffConfig
	logger  watermill.LoggerAdapter
	metrics *telemetry.Instruments
}

// NewBackoff returns a Backoff, or an error naming the first invalid field of config.
func NewBackoff(config BackoffConfig, logger watermill.LoggerAdapter) (*Backoff, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	config = config.WithDefaults()
	metrics, err := telemetry.New(config.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("middleware: %w", err)
	}
	return &Backoff{cfg: config, logger: logger, metrics: metrics}, nil
}

// MaxAttempts returns the number of attempts a message gets.
func (b *Backoff) MaxAttempts() int { return b.cfg.MaxAttempts }

// Delay returns the wait after attempt (1 for the first) failed, before the next one.
func (b *Backoff) Delay(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	if n := len(b.cfg.Delays); n > 0 {
		return b.cfg.Delays[min(attempt, n)-1]
	}
	e := &backoff.ExponentialBackOff{
		InitialInterval:     b.cfg.Initial,
		RandomizationFactor: b.cfg.Jitter,
		Multiplier:          b.cfg.Multiplier,
		MaxInterval:         b.cfg.Max,
		Clock:               backoff.SystemClock,
	}
	e.Reset()
	var d time.Duration
	for range attempt {
		d = e.NextBackOff()
	}
	return d
}

// Middleware is the message.HandlerMiddleware.
func (b *Backoff) Middleware(h message.HandlerFunc) message.HandlerFunc {
	if b.cfg.InPlace {
		return b.inPlace(h)
	}
	return func(msg *message.Message) ([]*message.Message, error) {
		b.boundAttempt(msg)
		out, err := h(msg)
		if err == nil {
			return out, nil
		}
		attempt, final := b.failed(msg, err)
		if final != nil {
			return nil, final
		}
		span := trace.SpanFromContext(msg.Context())
		queue := b.cfg.Queue(msg)
		if queue == "" {
			return nil, fmt.Errorf("no queue to retry in: %w", err)
		}

		retry := msg.Copy()
		retry.SetContext(msg.Context())
		bookkeeping := warren.DecodeAttemptRecord(retry.Metadata)
		bookkeeping.Attempt, bookkeeping.RetryQueue = attempt+1, queue
		bookkeeping.RecordFailure(msg.Context(), time.Now())
		bookkeeping.Encode(retry.Metadata)
		if id := DerivedPublishID(msg, "/"+strconv.Itoa(attempt+1)); id != "" {
			retry.Metadata.Set(warren.MetadataPublishID, id) // copies of msg make copies of its retry
		}
		wait := b.Delay(attempt)
		warren.Delay(retry, wait)
		span.SetAttributes(attribute.Int64("warren.retry.delay_ms", wait.Milliseconds()))

		if perr := b.cfg.Publisher.Publish(queue, retry); perr != nil {
			perr = fmt.Errorf("retry attempt %d of message %s: %w (handler error: %v)", attempt+1, msg.UUID, perr, err)
			if warren.IsPermanent(perr) {
				return nil, perr // it can never be retried: poison it
			}
			return nil, &RequeueError{Err: perr} // not acked: the broker delivers it again
		}
		b.metrics.RetryScheduled(msg.Context(), queue, attempt+1)
		b.logger.Info("Handler failed, retry scheduled", watermill.LogFields{
			"message_uuid": msg.UUID, "queue": queue, "attempt": attempt, "next_attempt_in": wait, "err": err.Error(),
		})
		return nil, nil
	}
}

// failed records err, the failure of attempt number attempt of msg, on its span, and returns
// what to return instead of trying again, if anything: a requeue while the consumer stops, err
// itself when it is permanent or the last attempt.
func (b *Backoff) failed(msg *message.Message, err error) (attempt int, final error) {
	if rq := requeueIfStopping(msg, err); rq != nil {
		return 0, rq
	}
	attempt = Attempt(msg)
	setError(trace.SpanFromContext(msg.Context()), err)
	if warren.IsPermanent(err) || attempt >= b.cfg.MaxAttempts {
		return attempt, err
	}
	return attempt, nil
}

// inPlace is Middleware with BackoffConfig.InPlace: every attempt runs on the same delivery.
func (b *Backoff) inPlace(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		b.boundAttempt(msg)
		for {
			out, err := h(msg)
			if err == nil {
				return out, nil
			}
			attempt, final := b.failed(msg, err)
			if final != nil {
				return nil, final
			}
			queue := b.cfg.Queue(msg)
			wait := b.Delay(attempt)
			b.metrics.RetryScheduled(msg.Context(), queue, attempt+1)
			b.logger.Info("Handler failed, retrying in place", watermill.LogFields{
				"message_uuid": msg.UUID, "queue": queue, "attempt": attempt, "next_attempt_in": wait, "err": err.Error(),
			})
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-msg.Context().Done(): // stopping: the broker delivers it again
				t.Stop()
				return nil, &RequeueError{Err: fmt.Errorf("consumer stopping before attempt %d: %w (handler error: %v)",
					attempt+1, context.Cause(msg.Context()), err)}
			case <-contract.StoppingFrom(msg.Context()):
				// The delivery went back to its queue (the consumer stopped, its channel was
				// lost): another attempt here could come after what the next consumer does.
				t.Stop()
				return nil, &RequeueError{Err: fmt.Errorf("consumer stopped before attempt %d: the message is back in its queue "+
					"(handler error: %v)", attempt+1, err)}
			}
			record := warren.DecodeAttemptRecord(msg.Metadata)
			record.Attempt = attempt + 1
			record.RecordFailure(msg.Context(), time.Now())
			record.Encode(msg.Metadata)
			msg.SetContext(context.WithValue(msg.Context(), attemptKey{}, attempt+1))
		}
	}
}

// boundAttempt makes an attempt header that is not a number in 1..MaxAttempts attempt 1, and
// logs it: a foreign or forged header must neither poison a message at its first failure nor
// buy it more attempts.
func (b *Backoff) boundAttempt(msg *message.Message) {
	raw, ok := msg.Metadata[warren.AttemptKey]
	if !ok {
		return
	}
	if n, err := strconv.Atoi(raw); err == nil && n >= 1 && n <= b.cfg.MaxAttempts {
		return
	}
	b.logger.Info("Attempt header out of range, counted as attempt 1", watermill.LogFields{
		"message_uuid": msg.UUID, warren.AttemptKey: fmt.Sprintf("%.64s", raw), "max_attempts": b.cfg.MaxAttempts,
	})
	msg.Metadata.Set(warren.AttemptKey, "1")
	msg.SetContext(context.WithValue(msg.Context(), attemptKey{}, 1))
}

// DerivedPublishID returns the publish id (see contract.PublishIDHeader) of a message published
// because of msg: the id of the publish msg came from, without what was derived for a retry,
// followed by suffix; "" when msg did not come from warren's DLX publisher. Copies of msg then
// lead to copies of what it causes, which warren's subscriber recognises.
func DerivedPublishID(msg *message.Message, suffix string) string {
	d, ok := warren.DeliveryFrom(msg.Context())
	if !ok || d.PublishID == "" {
		return ""
	}
	root, _, _ := strings.Cut(d.PublishID, "/")
	return root + suffix
}

// ConsumedQueue returns the queue msg was consumed from: the one warren's subscriber
// recorded (warren.DeliveryFrom), else Watermill's subscribe topic.
func ConsumedQueue(msg *message.Message) string {
	if d, ok := warren.DeliveryFrom(msg.Context()); ok && d.Queue != "" {
		return d.Queue
	}
	return message.SubscribeTopicFromCtx(msg.Context())
}
