package middleware

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/telemetry"
	"github.com/warrenmq/warren/topology"
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
// consumed from, with its body and headers and the poison record that says why (see
// setPoisonHeaders and warren.PoisonRecord), and then acks it.
//
// What is not the handler's failure is passed on as a *RequeueError, and the message goes
// back to its queue: a RequeueError from inside (Backoff could not publish the retry), an
// error while the message's context has ended (shutdown), and a poison copy the broker did
// not take. A poison copy too large for a frame is never publishable: the message is then
// rejected into its queue's dead-letter path (see contract.DeadLetter; a warren work queue's
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
		reason := warren.PoisonReasonExhausted
		if warren.IsPermanent(err) {
			reason = warren.PoisonReasonPermanent
		}
		if _, herr := contract.HoldKey(msg.Context(), err); herr != nil {
			return nil, &RequeueError{Err: fmt.Errorf("hold the order key of message %s: %w (handler error: %v)", msg.UUID, herr, err)}
		}
		poison := msg.Copy()
		poison.SetContext(msg.Context())
		setPoisonHeaders(poison, err, reason, queue, time.Now())
		fields := watermill.LogFields{"message_uuid": msg.UUID, "queue": queue, "reason": reason, "attempts": Attempt(msg)}
		if perr := p.cfg.Publisher.Publish(p.cfg.Topic(queue), poison); perr != nil {
			perr = fmt.Errorf("poison message %s: %w (handler error: %v)", msg.UUID, perr, err)
			if errors.Is(perr, warren.ErrTooLarge) && contract.DeadLetter(msg.Context()) {
				p.logger.Error("Message too large to poison: rejected into its queue's dead-letter path", perr, fields)
				p.metrics.Poisoned(msg.Context(), queue, warren.PoisonReasonRejected)
				return nil, perr
			}
			return nil, &RequeueError{Err: perr}
		}
		p.metrics.Poisoned(msg.Context(), queue, reason)
		p.logger.Error("Message poisoned", err, fields)
		return nil, nil
	}
}

// setPoisonHeaders writes the poison record (see warren.PoisonRecord) of msg, which failed
// with err on the queue queue at now, into its metadata; msg's context gives the handler, the
// delivery and the trace. It records the failure in the attempt bookkeeping too (see
// warren.AttemptRecord.RecordFailure), makes sure the message is published at once, and moves
// its expiration into the record: a poison copy never expires.
func setPoisonHeaders(msg *message.Message, err error, reason, queue string, now time.Time) {
	ctx := msg.Context()
	md := msg.Metadata
	attempts := warren.DecodeAttemptRecord(md)
	attempts.RecordFailure(ctx, now)
	attempts.Encode(md)
	record := warren.PoisonRecord{
		Error: err.Error(), ErrorType: contract.ErrorType(err), Reason: reason,
		Handler: message.HandlerNameFromCtx(ctx), Queue: queue, Origin: attempts.Origin,
		Attempts: Attempt(msg), FirstFailure: attempts.FirstFailure, LastFailure: now,
		TraceID: TraceID(msg), Expiration: md[warren.MetadataExpiration],
	}
	var pe *PanicError
	if errors.As(err, &pe) {
		record.Stack = pe.Stack
	}
	delete(md, warren.MetadataExpiration)
	record.Encode(md)
	warren.Delay(msg, 0) // not again after Watermill's delay metadata it may carry
}
