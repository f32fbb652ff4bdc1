package amqpx

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/cenkalti/backoff/v4"
)

// Backoff says how long Reconnect waits between two sessions: Initial after the first
// failure, then half as long again each time (backoff's default multiplier, 1.5; each wait
// ±50% at random) up to Max. The waits start over after
// a session that called its steady function, or that lasted ResetAfter (0: never by time).
type Backoff struct {
	Initial, Max time.Duration
	ResetAfter   time.Duration
}

// Reconnect is warren's one loop for what holds a connection (a broker's or a database's)
// and connects again when it is lost: it runs session over and over until session returns
// nil or ctx ends, and returns nil then. Between two sessions it waits as b says. session
// calls steady once it got somewhere (a relay that moved rows): the waits start over.
//
// failed is told each failed session's error and the wait before the next (nil: nothing is
// told); it logs as its owner does, and an error it returns ends Reconnect with that error (a
// failure that no new session can cure). The backoff is made at the first failure: a session
// that succeeds at once costs nothing more.
func Reconnect(ctx context.Context, b Backoff, session func(ctx context.Context, steady func()) error,
	failed func(err error, wait time.Duration) error) error {
	var wait *backoff.ExponentialBackOff
	for ctx.Err() == nil {
		start := time.Now()
		var steady atomic.Bool
		err := session(ctx, func() { steady.Store(true) })
		if err == nil || ctx.Err() != nil {
			return nil
		}
		if wait == nil {
			wait = backoff.NewExponentialBackOff(backoff.WithInitialInterval(b.Initial), backoff.WithMaxInterval(b.Max),
				backoff.WithMaxElapsedTime(0))
		} else if steady.Load() || b.ResetAfter > 0 && time.Since(start) > b.ResetAfter {
			wait.Reset()
		}
		next := wait.NextBackOff()
		if failed != nil {
			if err := failed(err, next); err != nil {
				return err
			}
		}
		timer := time.NewTimer(next)
		select {
		case <-ctx.Done():
			timer.Stop()
		case <-timer.C:
		}
	}
	return nil
}

// HeldConnection is the Backoff of a component that holds a broker connection for as long as
// it runs (a scheduler, a ledger reader): from 100 ms up to 5 s, back to 100 ms after a
// session that lasted a minute.
var HeldConnection = Backoff{Initial: 100 * time.Millisecond, Max: 5 * time.Second, ResetAfter: time.Minute}

// LogEach returns a failed function for Reconnect that logs every failed session as an error,
// msg with fields and the wait ("in").
func LogEach(logger watermill.LoggerAdapter, msg string, fields watermill.LogFields) func(err error, wait time.Duration) error {
	return func(err error, wait time.Duration) error {
		logger.Error(msg, err, fields.Add(watermill.LogFields{"in": wait}))
		return nil
	}
}
