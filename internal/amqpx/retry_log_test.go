package amqpx_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/amqpx"
)

func messages(l *watermill.CaptureLoggerAdapter, level watermill.LogLevel) []string {
	var out []string
	for _, m := range l.Captured()[level] {
		out = append(out, m.Msg+" "+m.Fields["call"].(string))
	}
	return out
}

// A call that fails and then succeeds tells the logger once that it retries and once that it
// succeeded; the failures in between are debug lines.
func TestRetryLoggedSaysItRetriesAndSucceeds(t *testing.T) {
	logger := watermill.NewCaptureLogger()
	calls := 0
	err := amqpx.RetryLogged(context.Background(), 10*time.Second, "dlx: declare", logger, nil, func(context.Context) error {
		if calls++; calls < 3 {
			return errors.New("connection refused")
		}
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"Broker call failed, retrying dlx: declare", "Broker call succeeded after retrying dlx: declare"},
		messages(logger, watermill.InfoLogLevel))
	assert.Equal(t, []string{"Broker call failed again, retrying dlx: declare"}, messages(logger, watermill.DebugLogLevel))
	assert.Empty(t, logger.Captured()[watermill.ErrorLogLevel])
	last := logger.Captured()[watermill.InfoLogLevel][1]
	assert.Equal(t, 3, last.Fields["attempts"])
}

// A call that gives up says so at Error level, naming the subject; a call that succeeds at
// once, or fails for good, says nothing.
func TestRetryLoggedSaysItGaveUp(t *testing.T) {
	logger := watermill.NewCaptureLogger()
	err := amqpx.RetryLogged(context.Background(), 100*time.Millisecond, "", logger,
		func() string { return "dlx: publish to orders" }, func(context.Context) error { return errors.New("connection refused") })
	require.ErrorContains(t, err, "gave up after 100ms")
	errs := logger.Captured()[watermill.ErrorLogLevel]
	require.Len(t, errs, 1)
	assert.Equal(t, "Broker call gave up", errs[0].Msg)
	assert.Equal(t, "dlx: publish to orders", errs[0].Fields["call"])

	quiet := watermill.NewCaptureLogger()
	require.NoError(t, amqpx.RetryLogged(context.Background(), time.Second, "x", quiet, nil, func(context.Context) error { return nil }))
	require.Error(t, amqpx.RetryLogged(context.Background(), time.Second, "x", quiet, nil, func(context.Context) error {
		return amqpx.GiveUp(errors.New("access refused"))
	}))
	assert.Empty(t, quiet.Captured())
}
