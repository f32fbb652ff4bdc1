package ops_test

import (
	"context"
	"errors"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// propertyMetadata has a key of every AMQP property, and a header of the message's own.
var propertyMetadata = message.Metadata{
	warren.MetadataContentType:     "application/json",
	warren.MetadataContentEncoding: "gzip",
	warren.MetadataCorrelationID:   "corr-7",
	warren.MetadataReplyTo:         "replies",
	warren.MetadataType:            "order.created",
	warren.MetadataAppID:           "shop",
	warren.MetadataUserID:          "someoneelse",
	warren.MetadataTimestamp:       "2026-11-25T17:30:05Z",
	warren.MetadataPriority:        "9",
	warren.MetadataExpiration:      "3600000",
	"tenant":                       "acme",
}

// ownKeys returns the keys of md that propertyMetadata has.
func ownKeys(md message.Metadata) message.Metadata {
	out := message.Metadata{}
	for k := range propertyMetadata {
		if v, ok := md[k]; ok {
			out[k] = v
		}
	}
	return out
}

// assertProperties checks that d carries every property of propertyMetadata as a property
// (user-id as its header), expiration as wantExpiration.
func assertProperties(t *testing.T, d amqp.Delivery, wantExpiration string) {
	t.Helper()
	assert.Equal(t, "application/json", d.ContentType)
	assert.Equal(t, "gzip", d.ContentEncoding)
	assert.Equal(t, "corr-7", d.CorrelationId)
	assert.Equal(t, "replies", d.ReplyTo)
	assert.Equal(t, "order.created", d.Type)
	assert.Equal(t, "shop", d.AppId)
	assert.Equal(t, time.Date(2026, 11, 25, 17, 30, 5, 0, time.UTC), d.Timestamp.UTC())
	assert.Equal(t, uint8(9), d.Priority)
	assert.Equal(t, wantExpiration, d.Expiration)
	assert.Empty(t, d.UserId)
	assert.Equal(t, "someoneelse", d.Headers[warren.MetadataUserID])
	assert.Equal(t, "acme", d.Headers["tenant"])
}

// Every property survives a retry (through the delay levels), the poison queue (as
// properties, the expiration kept in a poison header so that the copy never expires) and a
// replay (as properties again, the expiration restored).
func TestEveryPropertySurvivesRetryPoisonAndReplay(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("props")
	r, err := router.New(router.Config{
		Connection:      env.Connection(),
		ShutdownTimeout: 10 * time.Second,
		Topology:        topology.Config{Delay: env.Delay(topology.Delay{})},
		Retry:           middleware.BackoffConfig{Delays: []time.Duration{300 * time.Millisecond}}, // 2 attempts
	}, env.Logger())
	require.NoError(t, err)
	defer r.Close()
	var (
		mu   sync.Mutex
		seen []message.Metadata
	)
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, maps.Clone(msg.Metadata))
		return errors.New("not today")
	}))
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case <-r.Running():
	case err := <-done:
		t.Fatalf("router stopped: %v", err)
	case <-time.After(testenv.Patience()):
		t.Fatal("router did not start")
	}

	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":7}`))
	msg.Metadata = maps.Clone(propertyMetadata)
	require.NoError(t, r.Publisher().Publish(queue, msg))

	require.Eventually(t, func() bool { return env.Messages(topology.PoisonQueue(queue)) == 1 }, testenv.Patience(), 20*time.Millisecond)
	require.NoError(t, r.Close())
	require.NoError(t, <-done)
	mu.Lock()
	require.Len(t, seen, 2)
	assert.Equal(t, propertyMetadata, ownKeys(seen[0]), "the first delivery")
	assert.Equal(t, propertyMetadata, ownKeys(seen[1]), "the retry's delivery (through the delay levels)")
	mu.Unlock()

	// The poison copy: properties, and the expiration in a poison header.
	ch := env.Channel()
	d, ok, err := ch.Get(topology.PoisonQueue(queue), false)
	require.NoError(t, err)
	require.True(t, ok)
	assertProperties(t, d, "")
	assert.Equal(t, "3600000", d.Headers[warren.PoisonExpirationKey])
	assert.NotContains(t, d.Headers, warren.MetadataExpiration)
	for k := range propertyMetadata {
		if k != warren.MetadataUserID && k != "tenant" {
			assert.NotContains(t, d.Headers, k, "a property sent as a header too")
		}
	}
	poisoned, err := warren.Marshaler{}.Unmarshal(d)
	require.NoError(t, err)
	want := maps.Clone(propertyMetadata)
	delete(want, warren.MetadataExpiration)
	assert.Equal(t, want, ownKeys(poisoned.Metadata))
	require.NoError(t, d.Nack(false, true))
	// A quorum queue applies the requeue a moment later (the replay found the queue empty once
	// on RabbitMQ 4.0.5 with make test's 4 test binaries at once).
	require.Eventually(t, func() bool { return env.Messages(topology.PoisonQueue(queue)) == 1 }, testenv.Patience(), 20*time.Millisecond)

	// The replay: every property back, the expiration too.
	o := newOps(t, env.URL, topology.Delay{})
	res, err := o.ReplayPoisoned(context.Background(), queue, ops.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, res.Replayed)
	replayed := drain(t, env, queue)
	require.Len(t, replayed, 1)
	d = replayed[0]
	assertProperties(t, d, "3600000")
	assert.Equal(t, msg.UUID, d.MessageId)
	for k := range d.Headers {
		assert.False(t, strings.HasPrefix(k, warren.PoisonHeaderPrefix), "poison header %s left", k)
	}
	back, err := warren.Marshaler{}.Unmarshal(d)
	require.NoError(t, err)
	assert.Equal(t, propertyMetadata, ownKeys(back.Metadata))
}

// A replay restores a kept expiration the broker would refuse as a header, never as the
// property; a user-id property (a message the broker dead-lettered itself) becomes the
// header.
func TestReplayKeepsWhatThePropertyCannotTake(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("badexp")
	ch := env.Channel()
	for i, exp := range []string{"abc", "600000"} {
		p := poisonMessage(i, q)
		p.Headers[warren.PoisonExpirationKey] = exp
		p.UserId = "guest" // as the broker keeps it on a message it dead-letters
		require.NoError(t, ch.Publish("", topology.PoisonQueue(q), false, false, p))
	}
	require.Eventually(t, func() bool { return env.Messages(topology.PoisonQueue(q)) == 2 }, testenv.Patience(), 20*time.Millisecond)
	o := newOps(t, env.URL, topology.Delay{})
	res, err := o.ReplayPoisoned(context.Background(), q, ops.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, 2, res.Replayed)
	var got []amqp.Delivery
	require.Eventually(t, func() bool { got = append(got, drain(t, env, q)...); return len(got) == 2 }, testenv.Patience(), 20*time.Millisecond)
	assert.Empty(t, got[0].Expiration)
	assert.Equal(t, "abc", got[0].Headers[warren.MetadataExpiration])
	assert.Equal(t, "600000", got[1].Expiration)
	for _, d := range got {
		assert.Empty(t, d.UserId)
		assert.Equal(t, "guest", d.Headers[warren.MetadataUserID])
	}
}

// A message that expires in its work queue (its own expiration, say a retry's published at
// once) is dead-lettered into the poison queue by the broker, which removes the expiration:
// a replay does not make it expire again.
func TestExpiredInTheWorkQueueIsPoisonedAndReplayedWithoutExpiration(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("expired")
	ch := env.Channel()
	require.NoError(t, ch.Publish("", q, false, false, amqp.Publishing{MessageId: "short-lived", Expiration: "1",
		CorrelationId: "corr-1", Body: []byte("x")}))
	require.Eventually(t, func() bool { return env.Messages(topology.PoisonQueue(q)) == 1 }, testenv.Patience(), 20*time.Millisecond)
	o := newOps(t, env.URL, topology.Delay{})
	msgs, err := o.Poisoned(context.Background(), q, ops.Browse{})
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	assert.Equal(t, "dead-lettered by the broker: expired", msgs[0].Reason)

	res, err := o.ReplayPoisoned(context.Background(), q, ops.ReplayOptions{})
	require.NoError(t, err)
	require.Equal(t, 1, res.Replayed)
	got := drain(t, env, q)
	require.Len(t, got, 1)
	assert.Empty(t, got[0].Expiration)
	assert.Equal(t, "corr-1", got[0].CorrelationId)
}
