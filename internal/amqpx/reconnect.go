package amqpx

import (
	"context"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/cenkalti/backoff/v4"
)

// Reconnect runs session over and over until ctx ends: a component that holds a connection
// for as long as it runs (a scheduler, a ledger reader) and connects again when it is lost.
// Between sessions it waits with backoff (100 ms, doubling up to 5 s; back to 100 ms after
// a session that lasted a minute), and logs each lost one as msg with fields.
func Reconnect(ctx context.Context, logger watermill.LoggerAdapter, msg string, fields watermill.LogFields,
	session func(ctx context.Context) error) {
	wait := backoff.NewExponentialBackOff(backoff.WithInitialInterval(100*time.Millisecond), backoff.WithMaxInterval(5*time.Second),
		backoff.WithMaxElapsedTime(0))
	for ctx.Err() == nil {
		start := time.Now()
		err := session(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(start) > time.Minute {
			wait.Reset()
		}
		next := wait.NextBackOff()
		logger.Error(msg, err, fields.Add(watermill.LogFields{"in": next}))
		select {
		case <-ctx.Done():
		case <-time.After(next):
		}
	}
}
