package router_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/router"
)

// One writer makes every poison record: the poison copy of a delivery the subscriber cannot
// unmarshal carries the fields of a handler's poison copy, its error text is cut alike, and
// it records the trace of the trace context it came with.
func TestUndecodablePoisonCopyHasTheRecordOfAHandlersOne(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("one-writer")
	long := strings.Repeat("x", warren.MaxPoisonErrorLen+100)
	r := newRouter(t, env, func(c *router.Config) { c.Marshaler = pickyMarshaler{} })
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Name: "payments", Queue: queue}, func(msg *message.Message) error {
		return warren.Permanent(errors.New(long))
	}))
	start(t, r)

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	traceparent := "00-" + traceID + "-00f067aa0ba902b7-01"
	publishRaw(t, env, "", queue, amqp.Publishing{MessageId: "undecodable", Headers: amqp.Table{"traceparent": traceparent, "encoding": long}})
	undecodable := poisoned(t, env, queue, testenv.Patience())
	publishRaw(t, env, "", queue, amqp.Publishing{MessageId: "failing", Headers: amqp.Table{"traceparent": traceparent}})
	failing := poisoned(t, env, queue, testenv.Patience())
	require.Equal(t, "undecodable", undecodable.MessageId)
	require.Equal(t, "failing", failing.MessageId)

	fields := func(d amqp.Delivery) []string {
		var keys []string
		for k := range d.Headers {
			if warren.IsPoisonBookkeeping(k) {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		return keys
	}
	assert.Equal(t, fields(failing), fields(undecodable), "the same fields")
	assert.Contains(t, fields(undecodable), warren.PoisonTraceIDKey)

	u, f := warren.DecodePoisonTable(undecodable.Headers), warren.DecodePoisonTable(failing.Headers)
	assert.Equal(t, warren.PoisonReasonUndecoded, u.Reason)
	assert.Equal(t, warren.PoisonReasonPermanent, f.Reason)
	assert.True(t, strings.HasPrefix(u.Error, "unmarshal: unknown encoding xxx"), u.Error[:40])
	for name, rec := range map[string]warren.PoisonRecord{"undecodable": u, "handler's": f} {
		assert.Len(t, rec.Error, warren.MaxPoisonErrorLen+len("…"), "%s: the error text is cut", name)
		assert.True(t, strings.HasSuffix(rec.Error, "…"), name)
		assert.Equal(t, traceID, rec.TraceID, name)
		assert.Equal(t, "*errors.errorString", rec.ErrorType, name)
		assert.Equal(t, "payments", rec.Handler, name)
		assert.Equal(t, queue, rec.Queue, name)
		assert.Equal(t, &warren.Origin{Exchange: "", RoutingKey: queue}, rec.Origin, name)
		assert.Equal(t, 1, rec.Attempts, name)
		assert.False(t, rec.FirstFailure.IsZero(), name)
		assert.Equal(t, rec.FirstFailure, rec.LastFailure, name)
	}
}
