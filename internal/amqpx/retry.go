package amqpx

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/cenkalti/backoff/v4"
)

// GiveUp marks err as not worth retrying: Retry returns it at once, unwrapped. It is about one
// broker call; warren.Permanent, about one message (its handler is not run again), is another thing.
func GiveUp(err error) error {
	if err == nil {
		return nil
	}
	return backoff.Permanent(err)
}

// Retry runs op until it succeeds, returns an error marked by GiveUp, ctx ends or limit has elapsed,
// and keeps that limit exactly: every attempt gets a context that ends at the deadline,
// transient failures are retried with exponential backoff (each wait clamped to the time
// left), and Retry returns at the deadline, not before, with an error that says what was
// attempted, the limit, and wraps the last failure (and, when the deadline cut that one
// short, the last failure before it, which says why). If ctx ends first, Retry returns at once
// with an error that wraps ctx's cause and says what the last failure was. An empty what
// leaves the errors without it.
func Retry(ctx context.Context, limit time.Duration, what string, op func(ctx context.Context) error) error {
	return RetryLogged(ctx, limit, what, nil, nil, op)
}

// RetryLogged is Retry, telling logger what users need to know (nothing when logger is nil):
// the first transient failure (Info: retrying, until when), the success after failures
// (Info: after how many attempts and how long) and the give-up (Error). Later failures are
// logged at Debug. The log lines name subject() when subject is not nil, else what.
func RetryLogged(ctx context.Context, limit time.Duration, what string, logger watermill.LoggerAdapter,
	subject func() string, op func(ctx context.Context) error) error {
	if limit <= 0 {
		return prefixed(what, fmt.Errorf("time limit %s is not positive", limit))
	}
	if ctx.Err() != nil {
		return prefixed(what, context.Cause(ctx))
	}
	deadline := time.Now().Add(limit)
	// Every attempt ends at the deadline: a context of its own, unless ctx ends by then anyway
	// (an rpc call's, whose limit is its context's).
	attemptCtx, cancel := ctx, context.CancelFunc(nil)
	if d, ok := ctx.Deadline(); !ok || d.After(deadline) {
		attemptCtx, cancel = withDeadline(ctx, deadline)
		defer cancel()
	}

	var b *backoff.ExponentialBackOff // made at the first failure: most calls succeed at once
	var log *retryLog
	var logState retryLog // log's, outside the loop: the caller's closures stay on its stack
	var cause error       // the last failure that the deadline did not cut short
	for {
		err := op(attemptCtx)
		if err == nil {
			log.succeeded()
			return nil
		}
		var perm *backoff.PermanentError
		if errors.As(err, &perm) {
			return prefixed(what, perm.Err)
		}
		if !cutShort(err) {
			cause = err
		}
		if log == nil && logger != nil {
			name := what
			if subject != nil {
				name = subject()
			}
			logState = retryLog{logger: logger, name: name, start: time.Now()}
			log = &logState
		}
		log.failed(err, deadline)
		if b == nil {
			b = backoff.NewExponentialBackOff()
			b.InitialInterval = 50 * time.Millisecond
			b.MaxInterval = 2 * time.Second
			b.MaxElapsedTime = 0 // the deadline is ours to keep
			b.Reset()
		}
		wait := min(b.NextBackOff(), time.Until(deadline))
		if wait > 0 {
			timer := time.NewTimer(wait)
			select {
			case <-timer.C:
			case <-attemptCtx.Done():
				timer.Stop()
			}
		}
		if ctx.Err() != nil { // the caller's, not the limit
			return prefixed(what, fmt.Errorf("%w (last failure: %w)", context.Cause(ctx), err))
		}
		if !time.Now().Before(deadline) {
			if cause != nil && cutShort(err) { // say why it failed before
				err = fmt.Errorf("%w (before that: %w)", err, cause)
			}
			err = prefixed(what, fmt.Errorf("gave up after %s: %w", limit, err))
			log.gaveUp(err)
			return err
		}
	}
}

// cutShort reports whether err is the deadline's doing: a context's, or a socket's that
// net.Dialer set from it (whichever comes first, a connect that the deadline cuts short
// fails with either).
func cutShort(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)
}

// retryLog tells a logger about one RetryLogged call; a nil *retryLog says nothing.
type retryLog struct {
	logger   watermill.LoggerAdapter
	name     string // the call's, in the log lines
	start    time.Time
	attempts int
}

func (l *retryLog) fields() watermill.LogFields {
	return watermill.LogFields{"call": l.name, "attempts": l.attempts}
}

func (l *retryLog) failed(err error, deadline time.Time) {
	if l == nil {
		return
	}
	l.attempts++
	f := l.fields().Add(watermill.LogFields{"err": err.Error(), "until": deadline.Format(time.RFC3339Nano)})
	if l.attempts == 1 {
		l.logger.Info("Broker call failed, retrying", f)
	} else {
		l.logger.Debug("Broker call failed again, retrying", f)
	}
}

func (l *retryLog) succeeded() {
	if l == nil {
		return
	}
	l.attempts++
	l.logger.Info("Broker call succeeded after retrying", l.fields().Add(watermill.LogFields{"after": time.Since(l.start).String()}))
}

func (l *retryLog) gaveUp(err error) {
	if l == nil {
		return
	}
	l.logger.Error("Broker call gave up", err, l.fields())
}

// prefixed returns err with what in front, or err itself when what is empty (a caller that
// formats what only when there is an error).
func prefixed(what string, err error) error {
	if what == "" {
		return err
	}
	return fmt.Errorf("%s: %w", what, err)
}
