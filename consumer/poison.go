package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/topology"
)

// unreadableError is the reason of a delivery whose headers the client could not read.
type unreadableError struct{ why string }

func (e *unreadableError) Error() string { return "the client cannot read its headers: " + e.why }

// poisonUndecodable publishes d as it is to the poison queue, with the reason, and settles
// it: acked once the poison copy is confirmed; rejected into the queue's dead-letter path if
// the copy is too large to publish; else requeued after RequeueDelay. It is never dropped.
func (sub *subscription) poisonUndecodable(d amqp.Delivery, info contract.Delivery, cause error,
	cs *channelState) {
	s := sub.s
	reason, failure := warren.PoisonReasonUndecoded, fmt.Errorf("unmarshal: %w", cause)
	var unreadable *unreadableError
	if errors.As(cause, &unreadable) {
		reason, failure = warren.PoisonReasonUnreadable, cause
	}
	headers := withoutBookkeeping(d.Headers)
	now := time.Now()
	warren.PoisonRecord{
		Error: failure.Error(), ErrorType: contract.ErrorType(failure), Reason: reason, Handler: s.cfg.HandlerName,
		Queue: sub.queue, Origin: &warren.Origin{Exchange: info.Exchange, RoutingKey: info.RoutingKey},
		Attempts: 1, FirstFailure: now, LastFailure: now, TraceID: traceID(d.Headers), Expiration: d.Expiration,
	}.EncodeTable(headers)
	pub := publishingOf(d, headers) // the expiration is in the poison record, which a replay restores it from
	fields := watermill.LogFields{"queue": sub.queue, "message_id": d.MessageId, "reason": reason}
	if size, err := amqpx.HeaderFrameSize(pub); err != nil || size > amqpx.MaxHeaderFrame {
		s.logger.Error("Undecodable message too large to poison: rejected into its queue's dead-letter path", cause, fields)
		cs.acks.settle(d.DeliveryTag, reject)
		s.metrics.Poisoned(context.Background(), sub.queue, warren.PoisonReasonRejected)
		return
	}
	if err := sub.publishPoison(pub); err != nil {
		s.logger.Error("Cannot poison an undecodable message: requeued", err, fields)
		cs.inflight.add()
		go func() {
			defer cs.inflight.done()
			sub.requeueLater(d.DeliveryTag, cs)
		}()
		return
	}
	s.logger.Error("Undecodable message poisoned", cause, fields)
	cs.acks.settle(d.DeliveryTag, ack)
	s.metrics.Poisoned(context.Background(), sub.queue, reason)
}

// withoutBookkeeping returns a copy of h without warren's bookkeeping headers (see
// warren.IsBookkeeping): what a poison copy of a delivery starts from.
func withoutBookkeeping(h amqp.Table) amqp.Table {
	out := amqp.Table{}
	for k, v := range h {
		if !warren.IsBookkeeping(k) {
			out[k] = v
		}
	}
	return out
}

// publishPoison publishes pub to the queue's poison queue on a confirm channel of its own of
// the publishing connection (see consumerconns.Conns), declaring the queue's topology first (its
// poison queue may have been deleted), and returns nil once the broker has confirmed it and
// not returned it.
func (sub *subscription) publishPoison(pub amqp.Publishing) error {
	ctx, cancel := context.WithTimeout(context.Background(), sub.s.cfg.Connection.ConnectTimeout)
	defer cancel()
	conn, err := sub.s.conns.Publish.Get(ctx)
	if err != nil {
		return err
	}
	pc, err := conn.Channel()
	if err != nil {
		return err
	}
	defer pc.Close()
	if err := sub.s.builder.DeclareQueue(ctx, pc, sub.s.queue(sub.queue)); err != nil {
		return err
	}
	return amqpx.PublishConfirmed(ctx, pc, "", topology.PoisonQueue(sub.queue), true, pub)
}

// traceID returns the hex id of the trace whose W3C trace context (traceparent) the headers h
// carry, as the router's tracing middleware would continue it; "" when they carry none. The
// poison copy of a delivery that never reached a handler records it, as one made by the
// Poison middleware does. A header that is not a string is no trace context.
func traceID(h amqp.Table) string {
	tc := propagation.TraceContext{}
	carrier := propagation.MapCarrier{}
	for _, k := range tc.Fields() {
		if s, ok := h[k].(string); ok {
			carrier[k] = s
		}
	}
	sc := trace.SpanContextFromContext(tc.Extract(context.Background(), carrier))
	if !sc.HasTraceID() {
		return ""
	}
	return sc.TraceID().String()
}
