package router

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/topology"
)

// chain is the default middleware chain (see Router), outermost first.
func (r *Router) chain(h HandlerConfig) ([]message.HandlerMiddleware, error) {
	retry := r.cfg.Retry
	if h.Retry != nil {
		retry = *h.Retry
	}
	retry.Publisher, retry.MeterProvider = r.retryPub, r.cfg.MeterProvider
	retry.InPlace = retry.InPlace || h.Lanes > 0 // through the delay levels, a key's later messages would pass
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

// nonClosing shields a shared publisher from Watermill's handler, which closes its
// publisher when it stops.
type nonClosing struct{ message.Publisher }

func (nonClosing) Close() error { return nil }
