package middleware

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
)

// PanicError is the error Recoverer makes of a panic. Its stack goes into the poison
// message's headers.
type PanicError struct {
	Value any
	Stack string
}

// Error says what the handler panicked with.
func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// RequeueError is returned by Backoff and Poison for a message that goes back to its queue as
// it is, neither retried later nor poisoned: its retry or poison copy could not be published
// (the broker did not take it; that is no failure of the handler), or the consumer is
// shutting down (the handler's error came from the shutdown's own cancellation). Poison
// passes it on untouched; warren's subscriber requeues the message after a pause.
type RequeueError struct{ Err error }

// Error says why the message is requeued.
func (e *RequeueError) Error() string { return "requeued: " + e.Err.Error() }

// Unwrap returns the reason.
func (e *RequeueError) Unwrap() error { return e.Err }

// requeueIfStopping returns a *RequeueError when err is one, or when msg's context has ended
// (the consumer is shutting down and the handler's error is most likely its cancellation),
// and nil otherwise.
func requeueIfStopping(msg *message.Message, err error) error {
	var rq *RequeueError
	if errors.As(err, &rq) {
		return err
	}
	if ctx := msg.Context(); ctx.Err() != nil {
		return &RequeueError{Err: fmt.Errorf("consumer stopping: %w (handler error: %v)", context.Cause(ctx), err)}
	}
	return nil
}
