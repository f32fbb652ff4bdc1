package rpc

import (
	"errors"
	"fmt"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
)

// IsDirectReplyTo reports whether replyTo is an address of RabbitMQ's direct reply-to.
func IsDirectReplyTo(replyTo string) bool {
	return strings.HasPrefix(replyTo, warren.DirectReplyTo+".")
}

// RemoteError is the error Call returns for an error reply: the server gave the request up
// (it is in the poison queue) and says why.
type RemoteError struct {
	// Err is the text of the request's last error.
	Err string
	// Reason is why the request was poisoned (warren.PoisonReasonPermanent, ...).
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

// remoteError returns the error of reply, or nil when it is no error reply (it has no
// warren.RPCErrorKey). The rest comes from the request's poison record that it carries.
func remoteError(reply *message.Message) error {
	text, ok := reply.Metadata[warren.RPCErrorKey]
	if !ok {
		return nil
	}
	record := warren.DecodePoisonRecord(reply.Metadata)
	return &RemoteError{
		Err:      text,
		Reason:   record.Reason,
		Queue:    record.Queue,
		Handler:  record.Handler,
		Attempts: record.Attempts,
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
// message with a poison record, see warren.PoisonRecord), and its reply-to; nil and "" when
// the request has no reply-to. The error reply has an empty body, the request's correlation
// id, warren.RPCErrorKey (the error text) and the request's poison record without the stack.
func ErrorReply(poisoned *message.Message) (*message.Message, string) {
	replyTo, correlationID := ReplyTo(poisoned)
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

// ErrReplyLost is wrapped by the error of a Call whose reply can no longer arrive: with
// direct reply-to, the connection it was to arrive on was lost.
var ErrReplyLost = errors.New("the reply can no longer arrive")
