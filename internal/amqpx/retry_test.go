package amqpx_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
)

// within asserts that elapsed lies in [0.9·limit, 1.1·limit + 150ms].
func within(t *testing.T, limit, elapsed time.Duration, what string) {
	t.Helper()
	lo, hi := limit*9/10, limit*11/10+150*time.Millisecond
	assert.True(t, elapsed >= lo && elapsed <= hi, "%s: returned after %s, limit %s (window %s..%s)", what, elapsed, limit, lo, hi)
}

// A transient failure is retried until the limit, and Retry returns at the limit, not before
// (cenkalti's MaxElapsedTime stopped before the next wait: 6–42% early).
func TestRetryKeepsTheLimit(t *testing.T) {
	testenv.Slow(t)
	var wg sync.WaitGroup
	for _, limit := range []time.Duration{700 * time.Millisecond, time.Second, 1500 * time.Millisecond, 2 * time.Second, 3 * time.Second} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			calls := 0
			err := amqpx.Retry(context.Background(), limit, "op", func(ctx context.Context) error {
				calls++
				d, ok := ctx.Deadline()
				assert.True(t, ok && !d.After(start.Add(limit+50*time.Millisecond)), "the attempt's context ends at the limit")
				return errors.New("connection refused")
			})
			within(t, limit, time.Since(start), limit.String())
			require.Error(t, err)
			assert.Equal(t, "op: gave up after "+limit.String()+": connection refused", err.Error())
			assert.Greater(t, calls, 2)
		}()
	}
	wg.Wait()
}

// An attempt that blocks until its context ends (a broker that never answers) ends the
// call at the limit.
func TestRetryKeepsTheLimitOfABlockingAttempt(t *testing.T) {
	testenv.Slow(t)
	start := time.Now()
	err := amqpx.Retry(context.Background(), time.Second, "op", func(ctx context.Context) error {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(700 * time.Millisecond):
			return errors.New("no answer")
		}
	})
	within(t, time.Second, time.Since(start), "op")
	assert.ErrorContains(t, err, "gave up after 1s")
}

func TestRetryReturnsAPermanentErrorAtOnce(t *testing.T) {
	start, calls := time.Now(), 0
	refused := errors.New("access refused")
	err := amqpx.Retry(context.Background(), 5*time.Second, "op", func(context.Context) error {
		calls++
		return amqpx.GiveUp(refused)
	})
	assert.Less(t, time.Since(start), 100*time.Millisecond)
	assert.Equal(t, 1, calls)
	require.ErrorIs(t, err, refused)
	assert.Equal(t, "op: access refused", err.Error())
}

func TestRetryReturnsAtOnceWhenTheCallerCancels(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	err := amqpx.Retry(ctx, 5*time.Second, "op", func(context.Context) error { return errors.New("connection refused") })
	assert.Less(t, time.Since(start), 350*time.Millisecond)
	require.ErrorIs(t, err, context.Canceled)
	assert.Contains(t, err.Error(), "canceled")
	assert.Contains(t, err.Error(), "connection refused", "the last failure")

	start = time.Now()
	err = amqpx.Retry(ctx, 5*time.Second, "op", func(context.Context) error { t.Error("called"); return nil })
	assert.Less(t, time.Since(start), 50*time.Millisecond)
	require.ErrorIs(t, err, context.Canceled)
}

// blackHole accepts TCP connections and never answers.
func blackHole(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { _ = c.Close() })
		}
	}()
	return l.Addr().String()
}

// The AMQP handshake is bounded by the context, whether it ends by its deadline or is
// cancelled.
func TestDialIsBoundedByTheContext(t *testing.T) {
	testenv.Slow(t)
	url := "amqp://guest:guest@" + blackHole(t) + "/"
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, _, err := amqpx.Dial(ctx, warren.Connection{URL: url}, "test")
	within(t, time.Second, time.Since(start), "dial")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "AMQP handshake with 127.0.0.1:")

	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	start = time.Now()
	_, _, err = amqpx.Dial(ctx, warren.Connection{URL: url}, "test")
	assert.Less(t, time.Since(start), 450*time.Millisecond)
	require.ErrorIs(t, err, context.Canceled)
}

// When the deadline cuts the last attempt short (a handshake under way, say), the error
// still says, and wraps, why the attempts before it failed.
func TestRetryGivesUpWithTheCauseTheDeadlineDidNotHide(t *testing.T) {
	testenv.Slow(t)
	refused := errors.New("x509: certificate signed by unknown authority")
	attempts := 0
	err := amqpx.Retry(context.Background(), 500*time.Millisecond, "op", func(ctx context.Context) error {
		attempts++
		if attempts == 1 {
			return refused
		}
		<-ctx.Done() // the second attempt lasts until the deadline
		return fmt.Errorf("AMQP handshake: %w", ctx.Err())
	})
	assert.Equal(t, 2, attempts)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, refused)
	assert.Equal(t, "op: gave up after 500ms: AMQP handshake: context deadline exceeded (before that: "+refused.Error()+")", err.Error())
}

// A socket deadline that cuts the last attempt short (net.Dialer's, os.ErrDeadlineExceeded)
// hides the cause no more than a context's does.
func TestRetryGivesUpWithTheCauseASocketDeadlineDidNotHide(t *testing.T) {
	testenv.Slow(t)
	refused := errors.New("connect: connection refused")
	attempts := 0
	err := amqpx.Retry(context.Background(), 300*time.Millisecond, "op", func(ctx context.Context) error {
		attempts++
		if attempts == 1 {
			return refused
		}
		<-ctx.Done()
		return fmt.Errorf("dial tcp: %w", os.ErrDeadlineExceeded)
	})
	require.ErrorIs(t, err, refused)
	assert.Equal(t, "op: gave up after 300ms: dial tcp: i/o timeout (before that: "+refused.Error()+")", err.Error())
}
