package amqpx_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
)

// The reply CI got when parallel publishers declared the same delay level at once.
var absent = &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - home node 'rabbit@localhost' of durable queue " +
	"'wt.TestPubSubSuiteQueues.92ab7dfb.delay.1ms.r16.p5.d1' in vhost '/' is down or inaccessible"}

// A refusal is returned at once; an absent durable queue is retried until it is there.
func TestRetryClassifiesBrokerReplies(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply *amqp.Error
		calls int
		ok    bool
	}{
		{"absent queue is retried", absent, 2, true},
		{"missing exchange is permanent", &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange 'x' in vhost '/'"}, 1, false},
		{"mismatch is permanent", &amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - inequivalent arg"}, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			err := amqpx.Retry(context.Background(), 10*time.Second, "declare", func(context.Context) error {
				calls++
				if calls == 1 {
					return amqpx.GiveUpIfRefused(fmt.Errorf("topology: declare queue: %w", tc.reply))
				}
				return nil
			})
			assert.Equal(t, tc.calls, calls)
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, tc.reply)
			}
		})
	}
}

// Do returns its call's result; a call the broker does not answer ends after the context,
// with the context's error, and its channel closed; a context already ended makes no call.
func TestDoBoundsOneCallByTheContext(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	proxy, url := testenv.ProxyURL(t, env.URL)
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)

	q := env.Queue("do")
	err = amqpx.Do(context.Background(), ch, func() error { _, err := ch.QueueDeclarePassive(q, true, false, false, false, nil); return err })
	require.ErrorContains(t, err, "NOT_FOUND", "the call's own error")
	ch, err = conn.Channel()
	require.NoError(t, err)
	require.NoError(t, amqpx.Do(context.Background(), ch, func() error { return ch.Qos(1, 0, false) }))

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, amqpx.Do(cancelled, ch, func() error { t.Error("called"); return nil }), context.Canceled)

	// A broker that does not answer: as warren's components do, Watch closes the connection
	// (which ends the channel's close too) when Do's close of the channel gets no answer.
	proxy.Freeze()
	defer proxy.Thaw()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	stop := amqpx.Watch(ctx, conn)
	defer stop()
	err = amqpx.Do(ctx, ch, func() error { return ch.Qos(2, 0, false) })
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, ch.IsClosed(), "the channel is closed")
}
