package middleware_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/middleware"
)

// inPlace returns a Backoff retrying in place on its schedule, and the publisher it must
// never use.
func inPlace(t *testing.T, delays ...time.Duration) (*middleware.Backoff, *recordingPublisher) {
	t.Helper()
	pub := &recordingPublisher{}
	b, err := middleware.NewBackoff(middleware.BackoffConfig{Publisher: pub, Delays: delays, InPlace: true,
		Queue: func(*message.Message) string { return "q" }}, nil)
	require.NoError(t, err)
	return b, pub
}

// Retried in place, a message runs again as the next attempt after its wait, up to
// MaxAttempts, and nothing is published; the last failure is returned (to be poisoned).
func TestBackoffInPlaceRunsTheHandlerAgain(t *testing.T) {
	b, pub := inPlace(t, time.Millisecond, 2*time.Millisecond)
	var attempts []int
	h := middleware.RetryCount(b.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		attempts = append(attempts, middleware.Attempt(msg))
		if len(attempts) < 3 {
			return nil, errors.New("not yet")
		}
		return nil, nil
	}))
	msg := message.NewMessage("m", nil)
	_, err := h(msg)
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2, 3}, attempts)
	assert.Equal(t, "3", msg.Metadata.Get(warren.AttemptKey))
	assert.Zero(t, pub.calls)

	attempts = nil
	fails := middleware.RetryCount(b.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		attempts = append(attempts, middleware.Attempt(msg))
		return nil, errors.New("never")
	}))
	_, err = fails(message.NewMessage("n", nil))
	assert.EqualError(t, err, "never")
	assert.Equal(t, []int{1, 2, 3}, attempts, "MaxAttempts: len(Delays)+1")

	attempts = nil
	_, err = middleware.RetryCount(b.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		attempts = append(attempts, middleware.Attempt(msg))
		return nil, warren.Permanent(errors.New("hopeless"))
	}))(message.NewMessage("p", nil))
	assert.True(t, warren.IsPermanent(err))
	assert.Equal(t, []int{1}, attempts, "a permanent error is not retried")
	assert.Zero(t, pub.calls)
}

// A consumer that stops while a message waits for its next attempt has it requeued at once.
func TestBackoffInPlaceRequeuesWhenStopping(t *testing.T) {
	b, _ := inPlace(t, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	msg := message.NewMessage("m", nil)
	msg.SetContext(ctx)
	calls := 0
	h := b.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls++
		time.AfterFunc(10*time.Millisecond, cancel) // while it waits its hour
		return nil, errors.New("failed")
	})
	_, err := h(msg)
	var rq *middleware.RequeueError
	require.ErrorAs(t, err, &rq)
	assert.ErrorContains(t, err, "consumer stopping before attempt 2")
	assert.Equal(t, 1, calls)
}

// A message whose consumer stopped (its delivery back in its queue) is not tried again here.
func TestBackoffInPlaceEndsWhenTheDeliveryIsGone(t *testing.T) {
	b, _ := inPlace(t, time.Hour)
	stopping := make(chan struct{})
	msg := message.NewMessage("m", nil)
	msg.SetContext(contract.WithHandling(context.Background(), &contract.Handling{Stopping: stopping}))
	calls := 0
	_, err := b.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls++
		time.AfterFunc(10*time.Millisecond, func() { close(stopping) })
		return nil, errors.New("failed")
	})(msg)
	var rq *middleware.RequeueError
	require.ErrorAs(t, err, &rq)
	assert.ErrorContains(t, err, "consumer stopped before attempt 2")
	assert.Equal(t, 1, calls)
}
