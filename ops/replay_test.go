package ops_test

import (
	"context"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
)

// A replay of one failure group sends those messages back to their work queue, in order,
// without what the failure added, and leaves the others in the poison queue, in order.
func TestReplayGroup(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("replay")
	fill(t, env, q, 30)
	reader := sdkmetric.NewManualReader()
	o, err := ops.New(ops.Config{Connection: env.Connection(), MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))}, nil)
	require.NoError(t, err)
	defer o.Close()
	ctx := context.Background()

	all, err := o.Poisoned(ctx, q, ops.Browse{})
	require.NoError(t, err)
	groups := ops.Group(all)
	require.Len(t, groups, 3)
	var deadline ops.FailureGroup // the last message of the queue is one of them
	for _, g := range groups {
		if g.Error == "context deadline exceeded" {
			deadline = g
		}
	}
	require.Equal(t, 10, deadline.Count)

	var progress []int
	res, err := o.ReplayPoisoned(ctx, q, ops.ReplayOptions{Filter: ops.Filter{Group: deadline.ID}, Batch: 4,
		Progress: func(r ops.ReplayResult) { progress = append(progress, r.Replayed) }})
	require.NoError(t, err)
	assert.Equal(t, ops.ReplayResult{Total: 30, Scanned: 30, Replayed: 10, Failed: map[string]int{}}, res)
	assert.Equal(t, []int{4, 8, 10}, progress)
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	require.Len(t, rm.ScopeMetrics, 1)
	require.Len(t, rm.ScopeMetrics[0].Metrics, 1)
	redrives := rm.ScopeMetrics[0].Metrics[0]
	assert.Equal(t, "warren.redrives", redrives.Name)
	points := redrives.Data.(metricdata.Sum[int64]).DataPoints
	require.Len(t, points, 1)
	assert.Equal(t, int64(10), points[0].Value)
	assert.Equal(t, attribute.NewSet(attribute.String("warren.queue", q), attribute.String("warren.redrive.source", "poison")), points[0].Attributes)

	replayed := drain(t, env, q)
	require.Len(t, replayed, 10)
	for k, d := range replayed {
		i := 3*k + 2
		want := poisonMessage(i, q)
		assert.Equal(t, want.MessageId, d.MessageId)
		assert.Equal(t, want.Body, d.Body)
		assert.Equal(t, want.ContentType, d.ContentType)
		assert.Equal(t, uint8(amqp.Persistent), d.DeliveryMode)
		assert.Equal(t, "1", d.Headers[warren.ReplaysKey])
		assert.Equal(t, want.Headers["nested"], d.Headers["nested"])
		assert.Equal(t, want.Headers["tenant"], d.Headers["tenant"])
		for k := range d.Headers {
			assert.NotContains(t, k, "warren_poison_", "a poison header is left")
		}
		for k := range d.Headers { // a fresh round of attempts (the delivery's own: its publish id, its count in q)
			own := k == contract.PublishIDHeader || k == "x-delivery-count"
			assert.False(t, warren.IsBookkeeping(k) && !own, "bookkeeping %s left", k)
		}
		assert.NotEmpty(t, d.Headers[contract.PublishIDHeader], "a new publish id")
	}
	left := drain(t, env, topology.PoisonQueue(q))
	require.Len(t, left, 20)
	k := 0
	for i := range 30 {
		if i%3 != 2 {
			assert.Equal(t, "m"+strconv.Itoa(i), left[k].MessageId, "position %d", k)
			k++
		}
	}
}

// With a limit, the replay sends the first messages that match and leaves the rest in
// order; to a queue that does not exist, it sends nothing and says why.
func TestReplayLimitAndMissingDestination(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("limit")
	fill(t, env, q, 10)
	o := newOps(t, env.URL, topology.Delay{})
	ctx := context.Background()

	missing := env.Name("missing")
	res, err := o.ReplayPoisoned(ctx, q, ops.ReplayOptions{To: missing})
	require.NoError(t, err)
	assert.Equal(t, 0, res.Replayed)
	assert.Equal(t, map[string]int{"queue " + missing + " does not exist": 10}, res.Failed)
	assert.Equal(t, 10, res.Missing)

	res, err = o.ReplayPoisoned(ctx, q, ops.ReplayOptions{Limit: 3})
	require.NoError(t, err)
	assert.Equal(t, 3, res.Replayed)
	assert.Len(t, drain(t, env, q), 3)
	left := drain(t, env, topology.PoisonQueue(q))
	require.Len(t, left, 7)
	for k, d := range left {
		assert.Equal(t, "m"+strconv.Itoa(k+3), d.MessageId)
	}
}

// A replay of 1,000 poison messages while the broker drops the connection once loses none
// and sends none twice.
func TestReplayThroughADroppedConnection(t *testing.T) {
	t.Parallel()
	testenv.Slow(t)
	env := testenv.New(t)
	q := env.WorkQueue("drop")
	const n = 1000
	fill(t, env, q, n)
	proxy, url := testenv.ProxyURL(t, env.URL)
	o := newOps(t, url, topology.Delay{})

	var once sync.Once
	res, err := o.ReplayPoisoned(context.Background(), q, ops.ReplayOptions{Batch: 50, Progress: func(r ops.ReplayResult) {
		if r.Replayed >= 300 {
			once.Do(func() { go proxy.Drop() }) // while the next transaction is under way
		}
	}})
	require.NoError(t, err)
	assert.GreaterOrEqual(t, res.Reconnects, 1, "the connection was not dropped during the replay")
	// A commit whose answer the drop cut off happened or not: either way its messages are
	// counted once, as replayed or on the next pass.
	assert.LessOrEqual(t, res.Replayed, n)
	assert.GreaterOrEqual(t, res.Replayed, n-50)

	got := map[string]int{}
	for _, d := range drain(t, env, q) {
		got[d.MessageId]++
	}
	assert.Len(t, got, n, "messages lost")
	for id, c := range got {
		assert.Equal(t, 1, c, "message %s replayed %d times", id, c)
	}
	assert.Equal(t, 0, env.Messages(topology.PoisonQueue(q)))
}

// Parked messages (delayed to a queue deleted before they were due) are listed with their
// destination and replayed to it once it exists again.
func TestParked(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	delay := env.Delay(topology.Delay{})
	q := env.Queue("parked")
	// A publisher that does not declare its destination, which is deleted before the publish.
	pub, err := dlx.NewPublisher(dlx.Config{Connection: env.Connection(), Topology: topology.Config{Delay: delay},
		Route: func(topic string) dlx.Route { return dlx.Route{RoutingKey: topic, Declared: true} }}, env.Logger())
	require.NoError(t, err)
	defer pub.Close()
	ctx := context.Background()
	require.NoError(t, pub.Declare(ctx, topology.Topology{Queues: []topology.Queue{{Name: q}}}))
	_, err = env.Channel().QueueDelete(q, false, false, false)
	require.NoError(t, err)

	msg := message.NewMessage(watermill.NewUUID(), []byte("late"))
	warren.Delay(msg, 100*time.Millisecond)
	require.NoError(t, pub.Publish(q, msg))

	o := newOps(t, env.URL, delay)
	require.Eventually(t, func() bool { n, err := pub.Parked(ctx); return err == nil && n == 1 }, testenv.Patience(), 10*time.Millisecond)
	parked, err := o.Parked(ctx, ops.Browse{})
	require.NoError(t, err)
	require.Len(t, parked, 1)
	assert.Equal(t, msg.UUID, parked[0].ID)
	assert.Equal(t, q, parked[0].Destination)
	assert.Equal(t, ops.ParkedReasonGone, parked[0].Reason)

	res, err := o.ReplayParked(ctx, ops.ReplayOptions{})
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"queue " + q + " does not exist": 1}, res.Failed)
	assert.Equal(t, 1, res.Missing)

	require.NoError(t, pub.Declare(ctx, topology.Topology{Queues: []topology.Queue{{Name: q}}}))
	res, err = o.ReplayParked(ctx, ops.ReplayOptions{})
	require.NoError(t, err)
	assert.Equal(t, 1, res.Replayed)
	ds := drain(t, env, q)
	require.Len(t, ds, 1)
	assert.Equal(t, "late", string(ds[0].Body))
	assert.Equal(t, msg.UUID, ds[0].MessageId)
	assert.Equal(t, 0, env.Messages(delay.ParkingQueue()))
}

// Status reports a work queue's depth, consumers, kill state and poison depth, and the
// messages waiting in the delay levels.
func TestStatus(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	delay := env.Delay(topology.Delay{})
	q := env.Queue("status")
	pub, err := dlx.NewPublisher(dlx.Config{Connection: env.Connection(), Topology: topology.Config{Delay: delay}}, env.Logger())
	require.NoError(t, err)
	defer pub.Close()
	ctx := context.Background()
	for i := range 3 {
		m := message.NewMessage(watermill.NewUUID(), []byte("x"))
		if i == 0 {
			warren.Delay(m, time.Minute) // waits in the levels
		}
		require.NoError(t, pub.Publish(q, m))
	}
	fill(t, env, q, 2)
	k, err := kill.NewKiller(kill.Config{Connection: env.Connection()}, nil)
	require.NoError(t, err)
	require.ErrorIs(t, k.Kill(ctx, q, kill.Stop), kill.ErrNoListener)

	o := newOps(t, env.URL, delay)
	missing := env.Name("missing")
	s, err := o.Status(ctx, q, missing)
	require.NoError(t, err)
	require.Len(t, s.Queues, 2)
	assert.Equal(t, ops.QueueStatus{Queue: q, Exists: true, Ready: 2, Unacked: -1, Kill: kill.Stop, KillAt: s.Queues[0].KillAt, Poison: 2}, s.Queues[0])
	assert.False(t, s.Queues[0].KillAt.IsZero())
	assert.Equal(t, ops.QueueStatus{Queue: missing, Poison: -1, Unacked: -1}, s.Queues[1])
	assert.Equal(t, 1, s.Delay.Waiting)
	assert.Equal(t, 0, s.Delay.Missing)
	assert.Equal(t, 0, s.Delay.Parked)
	assert.Len(t, s.Delay.Levels, delay.QueueCount())
}

// A replay refuses a poison queue or a parking queue as its destination, where a replayed
// message would lose its reason, error and handler: an error, and nothing moves.
func TestReplayRefusesPoisonAndParkingQueues(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("noloop")
	fill(t, env, q, 3)
	other := env.WorkQueue("other")
	delay := env.Delay(topology.Delay{})
	o := newOps(t, env.URL, delay)
	ctx := context.Background()

	for _, to := range []string{topology.PoisonQueue(q), topology.PoisonQueue(other), delay.ParkingQueue(),
		topology.Delay{Prefix: "elsewhere", Unit: time.Second, Radix: 4}.ParkingQueue()} {
		res, err := o.ReplayPoisoned(ctx, q, ops.ReplayOptions{To: to})
		assert.Error(t, err, to)
		assert.ErrorContains(t, err, to)
		assert.Zero(t, res.Replayed)
		_, err = o.ReplayParked(ctx, ops.ReplayOptions{To: to})
		assert.ErrorContains(t, err, to)
	}
	assert.Equal(t, 3, env.Messages(topology.PoisonQueue(q)))
	assert.Zero(t, env.Messages(topology.PoisonQueue(other)))

	// A parked message whose destination is a poison queue stays, and the result says why.
	ch := env.Channel()
	_, err := ch.QueueDeclare(delay.ParkingQueue(), true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.PublishWithContext(ctx, "", delay.ParkingQueue(), true, false, amqp.Publishing{
		MessageId: "to-poison", Headers: amqp.Table{contract.DestQueueHeader: topology.PoisonQueue(q)}}))
	require.Eventually(t, func() bool { return env.Messages(delay.ParkingQueue()) == 1 }, testenv.Patience(), 10*time.Millisecond)
	res, err := o.ReplayParked(ctx, ops.ReplayOptions{})
	require.NoError(t, err)
	assert.Zero(t, res.Replayed)
	assert.Equal(t, map[string]int{"queue " + topology.PoisonQueue(q) + " is a poison queue, not a destination": 1}, res.Failed)
	assert.Zero(t, res.Missing, "it exists")
	assert.Equal(t, 1, env.Messages(delay.ParkingQueue()))
	assert.Equal(t, 3, env.Messages(topology.PoisonQueue(q)))
}

// Deleting what a filter selects removes those messages alone, up to the limit, and leaves
// the others in their order.
func TestDeletePoisoned(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("delete")
	fill(t, env, q, 12)
	o := newOps(t, env.URL, topology.Delay{})
	ctx := context.Background()

	n, err := o.DeletePoisoned(ctx, q, ops.Browse{Filter: ops.Filter{Error: regexp.MustCompile("not found")}, Limit: 3})
	require.NoError(t, err)
	assert.Equal(t, 3, n) // m1, m4, m7; m10 stays
	n, err = o.DeletePoisoned(ctx, q, ops.Browse{Filter: ops.Filter{Headers: map[string]string{"tenant": "t0"}}})
	require.NoError(t, err)
	assert.Equal(t, 5, n) // m0, m2, m6, m8, m10

	var ids []string
	for _, d := range drain(t, env, topology.PoisonQueue(q)) {
		ids = append(ids, d.MessageId)
	}
	assert.Equal(t, []string{"m3", "m5", "m9", "m11"}, ids)

	_, err = o.DeletePoisoned(ctx, env.Name("none"), ops.Browse{})
	require.ErrorIs(t, err, ops.ErrNoQueue)
}

// A browse that reads the first messages alone returns those, and leaves every message in
// the queue.
func TestBrowseScansTheHead(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("head")
	fill(t, env, q, 10)
	o := newOps(t, env.URL, topology.Delay{})
	ms, err := o.Poisoned(context.Background(), q, ops.Browse{Scan: 3})
	require.NoError(t, err)
	var ids []string
	for _, m := range ms {
		ids = append(ids, m.ID)
	}
	assert.Equal(t, []string{"m0", "m1", "m2"}, ids)
	ids = ids[:0]
	for _, d := range drain(t, env, topology.PoisonQueue(q)) {
		ids = append(ids, d.MessageId)
	}
	assert.ElementsMatch(t, []string{"m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9"}, ids)
}

// A replay right after a browse handed the head of the queue back takes every message: the
// broker counts them as not ready before it delivers them again (with 20,000 messages, a
// replay that took "none ready" for "none left" scanned none).
func TestReplayRightAfterABrowse(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("after")
	fill(t, env, q, 20000)
	o := newOps(t, env.URL, topology.Delay{})
	ctx := context.Background()
	_, err := o.Poisoned(ctx, q, ops.Browse{Scan: 10000})
	require.NoError(t, err)
	res, err := o.ReplayPoisoned(ctx, q, ops.ReplayOptions{Filter: ops.Filter{Error: regexp.MustCompile("deadline")}})
	require.NoError(t, err)
	assert.Equal(t, 20000, res.Scanned)
	assert.Equal(t, 6666, res.Replayed)
	assert.Equal(t, 6666, env.Messages(q))
	assert.Eventually(t, func() bool {
		p, err := env.Inspect(topology.PoisonQueue(q))
		return err == nil && p.Messages == 13334
	}, testenv.Patience(), 10*time.Millisecond)
}
