package rpc

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
)

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

// ErrReplyLost is wrapped by the error of a Call whose reply can no longer arrive: with
// direct reply-to, the connection it was to arrive on was lost.
var ErrReplyLost = errors.New("the reply can no longer arrive")
