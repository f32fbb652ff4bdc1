package amqpx

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// Under a context that never ends, the deadline's slot bounds the call: it ends at the
// slot's end, at most deadlineSlot after the deadline, and the calls of one slot share it.
func TestWithDeadlineSharesTheSlot(t *testing.T) {
	deadline := time.Now().Add(50 * time.Millisecond)
	ctx, cancel := withDeadline(context.Background(), deadline)
	defer cancel()
	same, cancelSame := withDeadline(context.Background(), deadline)
	defer cancelSame()
	assert.Same(t, ctx, same, "one context per slot under context.Background")

	d, ok := ctx.Deadline()
	assert.True(t, ok)
	assert.False(t, d.Before(deadline))
	assert.Less(t, d.Sub(deadline), deadlineSlot)

	type key struct{}
	valued, cancelValued := withDeadline(context.WithValue(context.Background(), key{}, "v"), deadline)
	defer cancelValued()
	assert.Equal(t, "v", valued.Value(key{}), "the parent's values")
	assert.Equal(t, ctx.Done(), valued.Done(), "the slot's timer")

	assert.NoError(t, ctx.Err())
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the slot did not end")
	}
	assert.False(t, time.Now().Before(deadline), "not before the deadline")
	assert.ErrorIs(t, ctx.Err(), context.DeadlineExceeded)
	assert.ErrorIs(t, context.Cause(valued), context.DeadlineExceeded)
}

// A context that can end by itself gets a deadline of its own.
func TestWithDeadlineUnderACancellableContext(t *testing.T) {
	parent, stop := context.WithCancel(context.Background())
	deadline := time.Now().Add(time.Hour)
	ctx, cancel := withDeadline(parent, deadline)
	defer cancel()
	d, _ := ctx.Deadline()
	assert.Equal(t, deadline, d)
	stop()
	<-ctx.Done()
	assert.ErrorIs(t, ctx.Err(), context.Canceled)
}
