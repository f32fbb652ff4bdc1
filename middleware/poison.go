package middleware

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/telemetry"
	"github.com/warrenmq/warren/topology"
)

// Headers a poison message gains, besides its own body and headers.
const (
	PoisonErrorKey      = "warren_poison_error"       // the error's text
	PoisonErrorTypeKey  = "warren_poison_error_type"  // the Go type of the innermost error
	PoisonReasonKey     = "warren_poison_reason"      // why it was given up: see PoisonReason*
	PoisonHandlerKey    = "warren_poison_handler"     // the Watermill handler's name
	PoisonQueueKey      = "warren_poison_queue"       // the queue it was consumed from
	PoisonExchangeKey   = "warren_poison_exchange"    // where it was first published: exchange
	PoisonRoutingKeyKey = "warren_poison_routing_key" // and routing key
	PoisonAttemptsKey   = "warren_poison_attempts"    // how many attempts were made
	PoisonFirstFailKey  = "warren_poison_first_failure"
	PoisonLastFailKey   = "warren_poison_last_failure"
	PoisonTraceIDKey    = "warren_poison_trace_id" // the trace the message belongs to
	PoisonStackKey      = "warren_poison_stack"    // for a panic: the goroutine's stack
	// PoisonExpirationKey keeps the message's expiration (warren.MetadataExpiration), which
	// the poison copy does not carry as its property: it would expire in the poison queue. A
	// replay (ops) restores the property.
	PoisonExpirationKey = "warren_poison_expiration"
)

// Values of PoisonReasonKey.
const (
	PoisonReasonPermanent = "permanent error"
	PoisonReasonExhausted = "attempts exhausted"
	PoisonReasonUndecoded = "cannot be unmarshaled"
	// PoisonReasonUnreadable: the client library could not read the message's headers (see
	// amqp091-go's limits in the README); they are replaced by their description.
	PoisonReasonUnreadable = "headers unreadable"
)

// PoisonHeaderPrefix starts the names of the Poison* headers.
const PoisonHeaderPrefix = "warren_poison_"

// Long texts are cut to keep the headers well below the broker's frame size.
const (
	maxErrorLen = 4 << 10
	maxStackLen = 16 << 10
)

// PoisonConfig configures Poison.
type PoisonConfig struct {
	// Publisher publishes to the poison queue: warren's *dlx.Publisher routing topics to
	// queues, possibly decorated. Required.
	Publisher message.Publisher
	// Topic names the poison queue of a work queue. Default topology.PoisonQueue.
	Topic func(queue string) string
	// Queue names the queue msg was consumed from. Default ConsumedQueue.
	Queue func(msg *message.Message) string
	// MeterProvider counts the messages poisoned (warren.messages.poisoned, by queue and
	// reason). Default: otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// WithDefaults returns c with every unset field set to its default.
func (c PoisonConfig) WithDefaults() PoisonConfig {
	if c.Topic == nil {
		c.Topic = topology.PoisonQueue
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
func (c PoisonConfig) Validate() error {
	if c.Publisher == nil {
		return errors.New("middleware: PoisonConfig.Publisher is nil")
	}
	return nil
}

// Poison sends a message whose handler failed for good (the error Backoff gives up on, or
// any error when there is no Backoff inside it) to the poison queue of the queue it was
// consumed from, with its body and headers and the Poison* headers that say why, and then
// acks it.
//
// What is not the handler's failure is passed on as a *RequeueError, and the message goes
// back to its queue: a RequeueError from inside (Backoff could not publish the retry), an
// error while the message's context has ended (shutdown), and a poison copy the broker did
// not take. A poison copy too large for a frame is never publishable: the message is then
// rejected into its queue's dead-letter path (see warren.DeadLetter; a warren work queue's
// leads to the same poison queue, with x-death saying "rejected"), and the reason logged.
type Poison struct {
	cfg     PoisonConfig
	logger  watermill.LoggerAdapter
	metrics *telemetry.Instruments
}

// NewPoison returns a Poison, or an error naming the first invalid field of config.
func NewPoison(config PoisonConfig, logger watermill.LoggerAdapter) (*Poison, error) {
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
	return &Poison{cfg: config, logger: logger, metrics: metrics}, nil
}

// Middleware is the message.HandlerMiddleware.
func (p *Poison) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil {
			return out, nil
		}
		if rq := requeueIfStopping(msg, err); rq != nil {
			return nil, rq
		}
		queue := p.cfg.Queue(msg)
		if queue == "" {
			return nil, fmt.Errorf("no queue to poison from: %w", err)
		}
		reason := PoisonReasonExhausted
		if warren.IsPermanent(err) {
			reason = PoisonReasonPermanent
		}
		poison := msg.Copy()
		poison.SetContext(msg.Context())
		SetPoisonHeaders(poison, err, reason, queue, time.Now())
		fields := watermill.LogFields{"message_uuid": msg.UUID, "queue": queue, "reason": reason, "attempts": Attempt(msg)}
		if perr := p.cfg.Publisher.Publish(p.cfg.Topic(queue), poison); perr != nil {
			perr = fmt.Errorf("poison message %s: %w (handler error: %v)", msg.UUID, perr, err)
			if errors.Is(perr, dlx.ErrTooLarge) && warren.DeadLetter(msg.Context()) {
				p.logger.Error("Message too large to poison: rejected into its queue's dead-letter path", perr, fields)
				p.metrics.Poisoned(msg.Context(), queue, PoisonReasonRejected)
				return nil, perr
			}
			return nil, &RequeueError{Err: perr}
		}
		p.metrics.Poisoned(msg.Context(), queue, reason)
		p.logger.Error("Message poisoned", err, fields)
		return nil, nil
	}
}

// SetPoisonHeaders adds the Poison* headers to msg, which failed with err on the queue
// queue at now; msg's context gives the handler, the delivery and the trace. It also makes
// sure the message is published at once, and moves its expiration to PoisonExpirationKey.
func SetPoisonHeaders(msg *message.Message, err error, reason, queue string, now time.Time) {
	ctx := msg.Context()
	recordFirstFailure(msg, now)
	md := msg.Metadata
	for k := range md {
		if strings.HasPrefix(k, PoisonHeaderPrefix) { // of an earlier poisoning: replaced, never kept
			delete(md, k)
		}
	}
	if exp, ok := md[warren.MetadataExpiration]; ok { // a poison copy never expires
		md.Set(PoisonExpirationKey, exp)
		delete(md, warren.MetadataExpiration)
	}
	md.Set(PoisonErrorKey, truncate(err.Error(), maxErrorLen))
	md.Set(PoisonErrorTypeKey, errorType(err))
	md.Set(PoisonReasonKey, reason)
	md.Set(PoisonHandlerKey, message.HandlerNameFromCtx(ctx))
	md.Set(PoisonQueueKey, queue)
	if _, known := md[OriginalExchangeKey]; known {
		md.Set(PoisonExchangeKey, md.Get(OriginalExchangeKey))
		md.Set(PoisonRoutingKeyKey, md.Get(OriginalRoutingKeyKey))
	}
	md.Set(PoisonAttemptsKey, strconv.Itoa(Attempt(msg)))
	md.Set(PoisonFirstFailKey, md.Get(FirstFailureKey))
	md.Set(PoisonLastFailKey, now.UTC().Format(time.RFC3339Nano))
	if id := TraceID(msg); id != "" {
		md.Set(PoisonTraceIDKey, id)
	}
	var pe *PanicError
	if errors.As(err, &pe) {
		md.Set(PoisonStackKey, truncate(pe.Stack, maxStackLen))
	}
	dlx.Delay(msg, 0) // not again after Watermill's delay metadata it may carry
}

// truncate cuts s to at most n bytes, and marks the cut with an ellipsis. The cut falls
// between characters: a text cut inside a UTF-8 sequence would be invalid.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// Reasons of messages the broker dead-lettered into a poison queue itself (see PoisonReason).
const (
	// PoisonReasonDeliveryLimit: a quorum work queue delivered the message as often as its
	// delivery limit allows, and no consumer settled it (each one crashed, lost its connection
	// or was stopped while it held the message).
	PoisonReasonDeliveryLimit = "delivery limit reached"
	// PoisonReasonRejected: a consumer rejected the message without requeueing it (warren does
	// for a message too large to publish as a poison copy; see warren.DeadLetter).
	PoisonReasonRejected = "rejected by its consumer"
)

// PoisonReason says why a message of a poison queue is there: the PoisonReasonKey header
// warren wrote or, for a message the broker dead-lettered without warren's headers, the
// reason of its latest dead-lettering (x-last-death-reason from RabbitMQ 3.13, else the newest
// entry of x-death). It returns "" for a message that is neither.
func PoisonReason(md message.Metadata) string {
	if r := md.Get(PoisonReasonKey); r != "" {
		return r
	}
	reason := md.Get("x-last-death-reason")
	if reason == "" {
		var deaths []struct {
			Reason string `json:"reason"`
		}
		if json.Unmarshal([]byte(md.Get("x-death")), &deaths) == nil && len(deaths) > 0 {
			reason = deaths[0].Reason // the broker keeps the newest first
		}
	}
	switch reason {
	case "":
		return ""
	case "delivery_limit":
		return PoisonReasonDeliveryLimit
	case "rejected":
		return PoisonReasonRejected
	}
	return "dead-lettered by the broker: " + reason
}
