package billing_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	billing "github.com/warrenmq/warren/examples/testing"
	"github.com/warrenmq/warren/handlers"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/warrentest"
)

// start runs the service on b until the test ends, and returns a function that publishes
// an order after delay.
func start(t *testing.T, b *warrentest.Broker, charge func(context.Context, billing.Order) error) func(billing.Order, time.Duration) {
	r, err := billing.New(b.Connection(), charge, watermill.NopLogger{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { // before the broker closes: the router stops first
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, r.Close())
	})
	<-r.Running()
	return func(o billing.Order, delay time.Duration) {
		msg, err := handlers.NewJSON(ctx, o)
		require.NoError(t, err)
		warren.Delay(msg, delay)
		require.NoError(t, r.Publisher().Publish(billing.Queue, msg))
	}
}

// An order delayed 2 s whose card fails twice: charged on the third attempt, 8 s after it
// was published, and not poisoned.
func TestAnOrderIsChargedOnItsThirdAttempt(t *testing.T) {
	warrentest.Run(t, warrentest.Config{}, func(t *testing.T, b *warrentest.Broker) {
		var charged atomic.Int64
		publish := start(t, b, func(ctx context.Context, o billing.Order) error {
			if middleware.AttemptFromContext(ctx) < 3 {
				return errors.New("card service unavailable")
			}
			charged.Add(int64(o.Cents))
			return nil
		})
		published := time.Now()
		publish(billing.Order{ID: 42, Cents: 1999}, 2*time.Second)

		b.Advance(2 * time.Second) // due: the first attempt fails
		assert.Equal(t, int64(0), charged.Load())
		b.Advance(6 * time.Second) // after 1 s and then 5 s: the second and third attempts
		assert.Equal(t, int64(1999), charged.Load())

		var attempts []int
		var after []time.Duration
		for _, d := range b.Delivered(billing.Queue) {
			attempts = append(attempts, d.Attempt)
			after = append(after, d.At.Sub(published))
		}
		assert.Equal(t, []int{1, 2, 3}, attempts)
		assert.Equal(t, []time.Duration{2 * time.Second, 3 * time.Second, 8 * time.Second}, after)
		assert.Empty(t, b.Poisoned(billing.Queue))
	})
}

// A card declined every time: three attempts, then the poison queue, with the reason.
func TestADeclinedOrderEndsInThePoisonQueue(t *testing.T) {
	warrentest.Run(t, warrentest.Config{}, func(t *testing.T, b *warrentest.Broker) {
		publish := start(t, b, func(context.Context, billing.Order) error { return errors.New("card declined") })
		publish(billing.Order{ID: 7, Cents: 500}, 0)
		b.Advance(time.Minute)

		poisoned := b.Poisoned(billing.Queue)
		require.Len(t, poisoned, 1)
		assert.Equal(t, warren.PoisonReasonExhausted, poisoned[0].Reason)
		assert.Equal(t, "card declined", poisoned[0].Error)
		assert.Equal(t, 3, poisoned[0].Attempts)
	})
}
