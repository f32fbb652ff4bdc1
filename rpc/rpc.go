package rpc

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/middleware"
)

// ErrorKey marks an error reply: its value is the error text of the request's failure. The
// error reply also carries the request's poison headers (middleware.PoisonReasonKey, ...).
const ErrorKey = "warren_rpc_error"

// IsDirectReplyTo reports whether replyTo is an address of RabbitMQ's direct reply-to.
func IsDirectReplyTo(replyTo string) bool {
	return strings.HasPrefix(replyTo, warren.DirectReplyTo+".")
}

// RemoteError is the error Call returns for an error reply: the server gave the request up
// (it is in the poison queue) and says why.
type RemoteError struct {
	// Err is the text of the request's last error.
	Err string
	// Reason is why the request was poisoned (middleware.PoisonReasonPermanent, ...).
	Reason string
	// Queue and Handler are where it failed; Attempts how many times it was tried.
	Queue, Handler string
	Attempts       int
	// Metadata is the error reply's metadata.
	Metadata message.Metadata
}

// Error says that the request was poisoned, where and why.
func (e *RemoteError) Error() string {
	return fmt.Sprintf("rpc: request poisoned by handler %q of queue %q (%s, %d attempts): %s",
		e.Handler, e.Queue, e.Reason, e.Attempts, e.Err)
}

// remoteError returns the error of reply, or nil when it is no error reply.
func remoteError(reply *message.Message) error {
	text, ok := reply.Metadata[ErrorKey]
	if !ok {
		return nil
	}
	attempts, _ := strconv.Atoi(reply.Metadata.Get(middleware.PoisonAttemptsKey))
	return &RemoteError{
		Err:      text,
		Reason:   reply.Metadata.Get(middleware.PoisonReasonKey),
		Queue:    reply.Metadata.Get(middleware.PoisonQueueKey),
		Handler:  reply.Metadata.Get(middleware.PoisonHandlerKey),
		Attempts: attempts,
		Metadata: reply.Metadata,
	}
}

// ReplyTo returns where the reply to request goes ("" for a request sent without one) and
// the correlation id it carries: the request's, else its message id.
func ReplyTo(request *message.Message) (replyTo, correlationID string) {
	correlationID = request.Metadata.Get(warren.MetadataCorrelationID)
	if correlationID == "" {
		correlationID = request.UUID
	}
	return request.Metadata.Get(warren.MetadataReplyTo), correlationID
}

// PrepareReply readies reply, which a handler returned for request, to be published to the
// request's reply-to: it gets the request's correlation id, no reply-to of its own, and
// request's context when it has none with a trace. It returns the reply-to ("" when the
// request has none: nobody waits for the reply).
func PrepareReply(request, reply *message.Message) (replyTo string) {
	replyTo, correlationID := ReplyTo(request)
	reply.Metadata.Set(warren.MetadataCorrelationID, correlationID)
	delete(reply.Metadata, warren.MetadataReplyTo)
	return replyTo
}

// ErrorReply returns the error reply to the request whose poison copy is poisoned (a
// message with the middleware.Poison* headers), and its reply-to; nil and "" when the
// request has no reply-to. The error reply has an empty body, the request's correlation id,
// ErrorKey and the poison headers.
func ErrorReply(poisoned *message.Message) (*message.Message, string) {
	replyTo, correlationID := ReplyTo(poisoned)
	if replyTo == "" {
		return nil, ""
	}
	reply := message.NewMessage(watermill.NewUUID(), nil)
	reply.SetContext(poisoned.Context())
	for k, v := range poisoned.Metadata {
		if strings.HasPrefix(k, middleware.PoisonHeaderPrefix) && k != middleware.PoisonStackKey {
			reply.Metadata.Set(k, v)
		}
	}
	text := poisoned.Metadata.Get(middleware.PoisonErrorKey)
	if text == "" {
		text = "request poisoned"
	}
	reply.Metadata.Set(ErrorKey, text)
	reply.Metadata.Set(warren.MetadataCorrelationID, correlationID)
	return reply, replyTo
}

// ErrReplyLost is wrapped by the error of a Call whose reply can no longer arrive: with
// direct reply-to, the connection it was to arrive on was lost.
var ErrReplyLost = errors.New("the reply can no longer arrive")
