package ops_test

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
)

// newOps returns an Ops on env's broker (or url), closed when the test ends.
func newOps(t *testing.T, url string, delay topology.Delay) *ops.Ops {
	t.Helper()
	o, err := ops.New(ops.Config{Connection: testenvConnection(url), Delay: delay}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = o.Close() })
	return o
}

// poisonMessage is message i as the Poison middleware would have written it: it failed in
// handler "charge" with one of three kinds of error.
func poisonMessage(i int, queue string) amqp.Publishing {
	errs := []string{
		fmt.Sprintf("order %d: card %x declined", i, 0xdead0000+i),
		fmt.Sprintf("order %d not found", i),
		"context deadline exceeded",
	}
	at := time.Date(2026, 11, 25, 10, 0, i, 0, time.UTC)
	return amqp.Publishing{
		MessageId:   "m" + strconv.Itoa(i),
		ContentType: "application/json",
		Body:        []byte(fmt.Sprintf(`{"order":%d}`, i)),
		Headers: amqp.Table{
			warren.PoisonErrorKey:     errs[i%3],
			warren.PoisonErrorTypeKey: "*errors.errorString",
			warren.PoisonReasonKey:    warren.PoisonReasonExhausted,
			warren.PoisonHandlerKey:   "charge",
			warren.PoisonQueueKey:     queue,
			warren.PoisonAttemptsKey:  "4",
			warren.PoisonLastFailKey:  at.Format(time.RFC3339Nano),
			warren.PoisonFirstFailKey: at.Add(-time.Second).Format(time.RFC3339Nano),
			warren.AttemptKey:         "3",
			// the rest of the bookkeeping a poison copy of a retried message carries
			warren.FirstFailureKey:       at.Add(-time.Second).Format(time.RFC3339Nano),
			warren.OriginalExchangeKey:   "orders",
			warren.OriginalRoutingKeyKey: "order.created",
			warren.RetryQueueKey:         queue,
			"tenant":                     "t" + strconv.Itoa(i%2),
			"nested":                     amqp.Table{"a": int32(i), "b": []any{"x", int64(i)}},
		},
	}
}

// fill publishes n poison messages into queue's poison queue, with confirms.
func fill(t *testing.T, env *testenv.Env, queue string, n int) {
	t.Helper()
	ch := env.Channel()
	require.NoError(t, ch.Confirm(false))
	var last *amqp.DeferredConfirmation
	for i := range n {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", topology.PoisonQueue(queue), true, false, poisonMessage(i, queue))
		require.NoError(t, err)
		last = dc
	}
	if last != nil {
		ok, err := last.WaitContext(context.Background())
		require.NoError(t, err)
		require.True(t, ok)
	}
}

// drain takes every message of queue, in order.
func drain(t *testing.T, env *testenv.Env, queue string) []amqp.Delivery {
	t.Helper()
	ch := env.Channel()
	var ds []amqp.Delivery
	for {
		d, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			return ds
		}
		ds = append(ds, d)
	}
}

// Browsing with filters and limits leaves the poison queue exactly as it was: the same
// messages, in the same order, with the same bodies, properties and headers (but the
// broker's delivery count).
func TestBrowseLeavesTheQueueAsItWas(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("browse")
	fill(t, env, q, 30)
	o := newOps(t, env.URL, topology.Delay{})

	all, err := o.Poisoned(context.Background(), q, ops.Browse{})
	require.NoError(t, err)
	require.Len(t, all, 30)
	for i, m := range all {
		assert.Equal(t, i+1, m.Position)
		assert.Equal(t, "m"+strconv.Itoa(i), m.ID)
		assert.Equal(t, q, m.Destination)
		assert.Equal(t, "charge", m.Handler)
		assert.Equal(t, 4, m.Attempts)
		assert.Equal(t, warren.PoisonReasonExhausted, m.Reason)
		assert.Nil(t, m.Body, "no bodies unless asked")
	}
	some, err := o.Poisoned(context.Background(), q, ops.Browse{
		Filter: ops.Filter{Error: regexp.MustCompile(`not found`), Headers: map[string]string{"tenant": "t1"}}, Limit: 3, Bodies: true})
	require.NoError(t, err)
	require.Len(t, some, 3)
	assert.Equal(t, []string{"m1", "m7", "m13"}, []string{some[0].ID, some[1].ID, some[2].ID})
	assert.JSONEq(t, `{"order":7}`, string(some[1].Body))

	ds := drain(t, env, topology.PoisonQueue(q))
	for _, d := range ds {
		t.Log(d.MessageId)
	}
	require.Len(t, ds, 30, "browsing lost or duplicated messages")
	for i, d := range ds {
		want := poisonMessage(i, q)
		assert.Equal(t, want.MessageId, d.MessageId, "position %d", i)
		assert.Equal(t, want.Body, d.Body)
		assert.Equal(t, want.ContentType, d.ContentType)
		delete(d.Headers, "x-delivery-count")
		assert.Equal(t, want.Headers, d.Headers)
	}
}

// Failures group by handler, error type and normalised error.
func TestGroup(t *testing.T) {
	msgs := []ops.Message{}
	for i := range 7 {
		m := poisonMessage(i, "q")
		msgs = append(msgs, ops.Message{ID: m.MessageId, Handler: "charge", ErrorType: "*errors.errorString",
			Error: m.Headers[warren.PoisonErrorKey].(string)})
	}
	groups := ops.Group(msgs)
	require.Len(t, groups, 3)
	assert.Equal(t, 3, groups[0].Count)
	assert.Equal(t, "order <n>: card <hex> declined", groups[0].Error)
	assert.Equal(t, "m0", groups[0].Example)
	assert.Equal(t, "order <n> not found", groups[1].Error)
	assert.Equal(t, 2, groups[1].Count)
	assert.Equal(t, "context deadline exceeded", groups[2].Error)
}

// Redacted changes a copy alone, and groups it by what redact left; a Filter with Redact
// selects by that copy.
func TestRedacted(t *testing.T) {
	m := ops.Message{ID: "m1", Handler: "charge", ErrorType: "*errors.errorString", Error: "card 4242 declined",
		Headers: map[string]string{"tenant": "t0"}, Body: []byte("secret")}
	m.Group = ops.Group([]ops.Message{m})[0].ID
	redact := func(m *ops.Message) {
		m.Headers["tenant"], m.Error = "***", "hidden"
		copy(m.Body, "******")
	}
	r := ops.Redacted(m, redact)
	assert.Equal(t, "t0", m.Headers["tenant"])
	assert.Equal(t, "secret", string(m.Body))
	assert.Equal(t, "card 4242 declined", m.Error)
	assert.Equal(t, "***", r.Headers["tenant"])
	assert.Equal(t, "******", string(r.Body))
	assert.Equal(t, ops.Group([]ops.Message{r})[0].ID, r.Group)
	assert.NotEqual(t, m.Group, r.Group)

	for f, want := range map[*ops.Filter]bool{
		{Headers: map[string]string{"tenant": "t0"}}:                  true,
		{Headers: map[string]string{"tenant": "t0"}, Redact: redact}:  false,
		{Headers: map[string]string{"tenant": "***"}, Redact: redact}: true,
		{Error: regexp.MustCompile("4242"), Redact: redact}:           false,
		{Group: m.Group, Redact: redact}:                              false,
		{Group: r.Group, Redact: redact}:                              true,
	} {
		assert.Equal(t, want, f.Match(m), "%+v", *f)
	}
	assert.Equal(t, "t0", m.Headers["tenant"], "Match redacts a copy")
	assert.Empty(t, ops.Redacted(ops.Message{ID: "p1", Headers: map[string]string{}}, redact).Group, "a parked message has no group")
}

func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		`user "bob" not found`:                                 `user <str> not found`,
		`id 0f8fad5b-d9cb-469f-a165-70867728950e: gone`:        `id <uuid>: gone`,
		`at 2026-11-25T10:00:01.5Z took 1.5s`:                  `at <time> took <n>s`,
		`object 5f2b9c1d3e4a: timeout after 30s (attempt 3/4)`: `object <hex>: timeout after <n>s (attempt <n>/<n>)`,
	} {
		assert.Equal(t, want, ops.Normalize(in), in)
	}
}

func testenvConnection(url string) warren.Connection { return warren.Connection{URL: url} }
