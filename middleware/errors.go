package middleware

import (
	"errors"
	"fmt"
)

// PermanentError marks an error that retrying cannot cure (a payload that cannot be decoded,
// a request that is invalid): the message goes to the poison queue at once.
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

// IsPermanent reports whether err is, or wraps, a permanent error.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// PanicError is the error Recoverer makes of a panic. Its stack goes into the poison
// message's headers.
type PanicError struct {
	Value any
	Stack string
}

// Error says what the handler panicked with.
func (e *PanicError) Error() string { return fmt.Sprintf("panic: %v", e.Value) }

// errorType names the type of the innermost error of err's chain, as the poison header
// says it: "*json.SyntaxError", "*middleware.PanicError".
func errorType(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return fmt.Sprintf("%T", err)
		}
		err = next
	}
}
