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
