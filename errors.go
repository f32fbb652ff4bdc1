package warren

import "errors"

// ErrClosed is wrapped by the error of a call on a closed component of warren (a
// dlx.Publisher, a router.Router or Subscriber, an rpc.Client, an ops.Ops, a redisstore
// Store): errors.Is(err, warren.ErrClosed) tells them all.
var ErrClosed = errors.New("closed")

// PermanentError marks an error that trying again cannot cure. A handler returns one (with
// Permanent) for a message that can never be processed, a payload that cannot be decoded or
// a request that is invalid: the message goes to the poison queue at once, without retries.
// A dlx.Publisher's Publish returns one where publishing again cannot succeed: a message
// too large or with invalid delay metadata, a message the broker returned (no queue takes
// it), a refusal by the broker (access refused, a missing exchange).
type PermanentError struct{ Err error }

// Error is the wrapped error's text, marked permanent.
func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as permanent. It returns nil for nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err is, or wraps, a PermanentError.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}
