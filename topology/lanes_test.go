package topology_test

import (
	"context"
	"fmt"
	"hash/fnv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// A key's lane is its 32-bit FNV-1a hash modulo the lanes, which a publisher outside warren
// can compute; 10,000 keys spread over 16 lanes.
func TestLaneIsFNV1aOfTheKey(t *testing.T) {
	assert.Equal(t, int(0xe40c292c%7), topology.Lane("a", 7), "FNV-1a 32 of \"a\" is 0xe40c292c")
	assert.Equal(t, int(0x811c9dc5%16), topology.Lane("", 16))
	counts := make([]int, 16)
	for i := range 10000 {
		key := fmt.Sprintf("order-%d", i)
		h := fnv.New32a()
		_, _ = h.Write([]byte(key))
		lane := topology.Lane(key, 16)
		require.Equal(t, int(h.Sum32()%16), lane)
		counts[lane]++
	}
	for lane, n := range counts {
		assert.InDelta(t, 625, n, 125, "lane %d", lane)
	}
	assert.Equal(t, "orders.lane.3", topology.LaneQueue("orders", 3))
}

func TestLanesOutOfRangeAreRefused(t *testing.T) {
	for _, lanes := range []int{-1, topology.MaxLanes + 1} {
		err := topology.Topology{Queues: []topology.Queue{{Name: "q", Lanes: lanes}}}.Validate()
		assert.ErrorContains(t, err, fmt.Sprintf("Queues[0].Lanes %d is outside 0..%d", lanes, topology.MaxLanes))
	}
}

// laneNames registers the lanes (and a few past them) of ordered queue q for removal.
func laneNames(env *testenv.Env, q string, n int) {
	var names []string
	for i := range n + 4 {
		names = append(names, topology.LaneQueue(q, i), topology.HeldQueue(q, i))
	}
	env.Remove(names, nil)
}

// An ordered queue is declared with its lanes, each with a single active consumer: a second
// consumer of a lane gets nothing while the first is there. The delivery exchange of the
// delay levels reaches every lane by its own name.
func TestOrderedQueueHasLanesWithASingleActiveConsumer(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("ordered")
	laneNames(env, q, 4)
	b := newBuilder(t, env, topology.Config{Delay: topology.Delay{Levels: 1}})
	top := topology.Topology{Queues: []topology.Queue{{Name: q, Lanes: 4}}}
	require.NoError(t, b.Apply(context.Background(), env.Connection(), top))
	r, err := b.Verify(context.Background(), env.Connection(), top)
	require.NoError(t, err)
	assert.True(t, r.OK(), r.String())
	for i := range 4 {
		_, err := env.Inspect(topology.LaneQueue(q, i))
		require.NoError(t, err)
	}
	_, err = env.Inspect(topology.LaneQueue(q, 4))
	require.ErrorContains(t, err, "NOT_FOUND")

	lane := topology.LaneQueue(q, 2)
	ch := env.Channel()
	first, err := ch.Consume(lane, "first", false, false, false, false, nil)
	require.NoError(t, err)
	ch2 := env.Channel()
	second, err := ch2.Consume(lane, "second", false, false, false, false, nil)
	require.NoError(t, err)
	// One after the other, each confirmed: publishes on two channels may reach the lane in
	// either order.
	pub := env.Channel()
	require.NoError(t, pub.Confirm(false))
	for _, p := range []struct{ exchange, key, body string }{{b.Delay().DeliveryExchange(), "", "one"}, {"", lane, "two"}} {
		dc, err := pub.PublishWithDeferredConfirm(p.exchange, p.key, false, false, amqp.Publishing{
			Headers: amqp.Table{contract.DestQueueHeader: lane}, Body: []byte(p.body)})
		require.NoError(t, err)
		require.True(t, dc.Wait())
	}
	for _, body := range []string{"one", "two"} {
		select {
		case d := <-first:
			assert.Equal(t, body, string(d.Body))
			require.NoError(t, d.Ack(false))
		case d := <-second:
			t.Fatalf("the second consumer got %q while the first is active", d.Body)
		case <-time.After(testenv.Patience()):
			t.Fatalf("%q did not arrive", body)
		}
	}
}

// A change of an ordered queue's lanes is refused by Apply and reported by Verify while an
// old lane holds a message; drained, it is applied, and the lanes past the new count are
// deleted.
func TestChangeOfLanesIsRefusedUntilDrained(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("relaned")
	laneNames(env, q, 4)
	b := newBuilder(t, env, topology.Config{Delay: topology.Delay{Levels: 1}})
	ctx := context.Background()
	with := func(n int) topology.Topology { return topology.Topology{Queues: []topology.Queue{{Name: q, Lanes: n}}} }
	require.NoError(t, b.Apply(ctx, env.Connection(), with(4)))
	ch := env.Channel()
	require.NoError(t, ch.Confirm(false))
	dc, err := ch.PublishWithDeferredConfirm("", topology.LaneQueue(q, 3), true, false, amqp.Publishing{Body: []byte("left")})
	require.NoError(t, err)
	require.True(t, dc.Wait())
	dc, err = ch.PublishWithDeferredConfirm("", topology.HeldQueue(q, 1), true, false, amqp.Publishing{Body: []byte("held")})
	require.NoError(t, err)
	require.True(t, dc.Wait())

	for _, n := range []int{2, 6} {
		err = b.Apply(ctx, env.Connection(), with(n))
		require.Error(t, err, "%d lanes", n)
		assert.ErrorContains(t, err, fmt.Sprintf("queue %q has 4 lanes on the broker and %d in the topology", q, n))
		assert.ErrorContains(t, err, topology.LaneQueue(q, 3)+" (1 ready, 0 consumers)")
		assert.ErrorContains(t, err, topology.HeldQueue(q, 1)+" (1 held)")
		r, err := b.Verify(ctx, env.Connection(), with(n))
		require.NoError(t, err)
		assert.False(t, r.OK())
		assert.Len(t, r.Lanes, 1, r.String())
	}
	_, err = env.Inspect(topology.LaneQueue(q, 4))
	require.ErrorContains(t, err, "NOT_FOUND", "nothing declared")

	_, err = env.Channel().QueuePurge(topology.LaneQueue(q, 3), false)
	require.NoError(t, err)
	_, err = env.Channel().QueuePurge(topology.HeldQueue(q, 1), false)
	require.NoError(t, err)
	require.NoError(t, b.Apply(ctx, env.Connection(), with(2)))
	for i, exists := range []bool{true, true, false, false} {
		_, err := env.Inspect(topology.LaneQueue(q, i))
		assert.Equal(t, exists, err == nil, "lane %d: %v", i, err)
		_, err = env.Inspect(topology.HeldQueue(q, i))
		assert.Equal(t, exists, err == nil, "held queue of lane %d: %v", i, err)
	}
	require.NoError(t, b.Apply(ctx, env.Connection(), with(3)), "2 drained lanes grow to 3")
	r, err := b.Verify(ctx, env.Connection(), with(3))
	require.NoError(t, err)
	assert.True(t, r.OK(), r.String())
}

func TestParseLane(t *testing.T) {
	for name, want := range map[string]struct {
		queue string
		lane  int
		ok    bool
	}{
		"orders.lane.3":     {"orders", 3, true},
		"a.lane.b.lane.12":  {"a.lane.b", 12, true},
		"orders.lane.03":    {},
		"orders.lane.-1":    {},
		"orders.lane.":      {},
		".lane.1":           {},
		"orders":            {},
		"orders.lane.1.dlq": {},
	} {
		q, lane, ok := topology.ParseLane(name)
		assert.Equal(t, want.ok, ok, name)
		assert.Equal(t, want.queue, q, name)
		assert.Equal(t, want.lane, lane, name)
	}
}

// What ordered lanes rest on: when a lane's active consumer goes with messages unacknowledged,
// the broker hands the lane to the next consumer, and those messages come first, in their
// order, before the rest of the lane.
func TestALaneTakenOverKeepsItsOrder(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("takeover")
	laneNames(env, q, 1)
	b := newBuilder(t, env, topology.Config{Delay: topology.Delay{Disabled: true}})
	require.NoError(t, b.Apply(context.Background(), env.Connection(), topology.Topology{Queues: []topology.Queue{{Name: q, Lanes: 1}}}))
	lane := topology.LaneQueue(q, 0)
	pub := env.Channel()
	for i := range 200 {
		publish(t, pub, "", lane, nil, fmt.Sprint(i))
	}
	require.Eventually(t, func() bool { // (a quorum queue with a single active consumer serves no basic.get)
		st, err := env.Inspect(lane)
		return err == nil && st.Messages == 200
	}, testenv.Patience(), 10*time.Millisecond)

	first := env.Channel()
	require.NoError(t, first.Qos(120, 0, false))
	took, err := first.Consume(lane, "first", false, false, false, false, nil)
	require.NoError(t, err)
	second := env.Channel()
	require.NoError(t, second.Qos(300, 0, false))
	next, err := second.Consume(lane, "second", false, false, false, false, nil)
	require.NoError(t, err)
	for i := range 120 { // held, unacknowledged; the first 20 acked
		d := <-took
		require.Equal(t, fmt.Sprint(i), string(d.Body))
		if i < 20 {
			require.NoError(t, d.Ack(false))
		}
	}
	require.NoError(t, first.Close())
	for i := 20; i < 200; i++ {
		select {
		case d := <-next:
			require.Equal(t, fmt.Sprint(i), string(d.Body), "taken over in the lane's order")
			require.NoError(t, d.Ack(false))
		case <-time.After(testenv.Patience()):
			t.Fatalf("message %d did not come to the second consumer", i)
		}
	}
}

// DeclareLane declares one lane and what it needs (its held queue, its binding, the poison
// queue it dead-letters into), and nothing of the queue's other lanes.
func TestDeclareLaneDeclaresOneLane(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("onelane")
	laneNames(env, q, 3)
	b := newBuilder(t, env, topology.Config{Delay: topology.Delay{Levels: 1}})
	require.NoError(t, b.DeclareLane(context.Background(), env.Channel(), topology.Queue{Name: q, Lanes: 3}, 1))
	for name, exists := range map[string]bool{
		topology.LaneQueue(q, 1): true, topology.HeldQueue(q, 1): true, topology.PoisonQueue(q): true,
		q: false, topology.LaneQueue(q, 0): false, topology.HeldQueue(q, 2): false,
	} {
		_, err := env.Inspect(name)
		assert.Equal(t, exists, err == nil, "%s: %v", name, err)
	}
}
