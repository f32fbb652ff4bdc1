package router

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
)

// publishReplies publishes the messages a replying handler (HandlerConfig.Reply) returns to
// the request's reply-to, with its correlation id, inside the chain like publishOutputs. A
// request without reply-to (sent with rpc.Client.Send) gets no reply; a reply the broker
// cannot route (the caller is gone) is logged, and the request acked.
func (r *Router) publishReplies(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err != nil || len(out) == 0 {
			return nil, err
		}
		replyTo, correlationID := replyAddress(msg)
		if replyTo == "" {
			r.logger.Debug("Request without reply-to: reply dropped", watermill.LogFields{"message_uuid": msg.UUID})
			return nil, nil
		}
		if err := msg.Context().Err(); err != nil { // shutting down: not published, not acked
			return nil, fmt.Errorf("reply to %q: %w", replyTo, context.Cause(msg.Context()))
		}
		for _, o := range out {
			prepareReply(msg, o)
		}
		deriveOutputs(msg, out)
		if err := r.publishReply(replyTo, correlationID, out...); err != nil {
			return nil, fmt.Errorf("reply to %q: %w", replyTo, err) // permanent if dlx says so
		}
		return nil, nil
	}
}

// publishReply publishes msgs to the reply-to address replyTo. A reply that no queue takes
// is logged and counts as published: the caller gave up (its reply queue is gone), and
// retrying or poisoning the request would not bring it back.
//
// Replies to a direct reply-to address are published without the mandatory flag: RabbitMQ
// (3.10.8 and 4.0.5, measured) returns every one of them to a mandatory publisher, delivered
// or not, so a return would say nothing and count every reply as failed.
func (r *Router) publishReply(replyTo, correlationID string, msgs ...*message.Message) error {
	pub := r.retryPub
	if isDirectReplyTo(replyTo) {
		pub = r.directPub
	}
	err := pub.Publish(replyTo, msgs...)
	var ret *dlx.ReturnedError
	if errors.As(err, &ret) {
		r.logger.Info("Reply not delivered: its caller is gone", watermill.LogFields{
			"reply_to": replyTo, "correlation_id": correlationID, "error": err.Error()})
		return nil
	}
	return err
}

// errorReplying publishes poison copies with next and then, for a request with a reply-to,
// the error reply (see errorReply): the caller learns at once that its request was
// given up. An error reply that cannot be published is logged; the request stays poisoned.
// The error reply is a new message: its content is the request's poison record (what
// rpc.RemoteError reads), and it carries none of the rest of the request's bookkeeping
// (see warren.IsBookkeeping).
type errorReplying struct {
	r    *Router
	next message.Publisher
}

func (p errorReplying) Publish(topic string, msgs ...*message.Message) error {
	if err := p.next.Publish(topic, msgs...); err != nil {
		return err
	}
	for _, m := range msgs {
		reply, replyTo := errorReply(m)
		if reply == nil {
			continue
		}
		correlationID := reply.Metadata.Get(warren.MetadataCorrelationID)
		if err := p.r.publishReply(replyTo, correlationID, reply); err != nil {
			p.r.logger.Error("Error reply not sent", err, watermill.LogFields{"reply_to": replyTo, "correlation_id": correlationID})
		}
	}
	return nil
}

func (errorReplying) Close() error { return nil }

// isDirectReplyTo reports whether replyTo is an address of RabbitMQ's direct reply-to.
func isDirectReplyTo(replyTo string) bool {
	return strings.HasPrefix(replyTo, warren.DirectReplyTo+".")
}

// replyAddress returns where the reply to request goes ("" for a request sent without one) and
// the correlation id it carries: the request's, else its message id.
func replyAddress(request *message.Message) (to, correlationID string) {
	correlationID = request.Metadata.Get(warren.MetadataCorrelationID)
	if correlationID == "" {
		correlationID = request.UUID
	}
	return request.Metadata.Get(warren.MetadataReplyTo), correlationID
}

// prepareReply readies reply, which a handler returned for request, to be published to the
// request's reply-to: it gets the request's correlation id, no reply-to of its own, and
// request's context when it has none with a trace. It returns the reply-to ("" when the
// request has none: nobody waits for the reply).
func prepareReply(request, reply *message.Message) (replyTo string) {
	replyTo, correlationID := replyAddress(request)
	reply.Metadata.Set(warren.MetadataCorrelationID, correlationID)
	delete(reply.Metadata, warren.MetadataReplyTo)
	return replyTo
}

// errorReply returns the error reply to the request whose poison copy is poisoned (a
// message with a poison record, see warren.PoisonRecord), and its reply-to; nil and "" when
// the request has no reply-to. The error reply has an empty body, the request's correlation
// id, warren.RPCErrorKey (the error text) and the request's poison record without the stack.
func errorReply(poisoned *message.Message) (*message.Message, string) {
	replyTo, correlationID := replyAddress(poisoned)
	if replyTo == "" {
		return nil, ""
	}
	reply := message.NewMessage(watermill.NewUUID(), nil)
	reply.SetContext(poisoned.Context())
	record := warren.DecodePoisonRecord(poisoned.Metadata)
	record.Stack = ""
	record.Encode(reply.Metadata)
	text := record.Error
	if text == "" {
		text = "request poisoned"
	}
	reply.Metadata.Set(warren.RPCErrorKey, text)
	reply.Metadata.Set(warren.MetadataCorrelationID, correlationID)
	return reply, replyTo
}
