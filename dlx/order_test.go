package dlx_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// A publisher that knows a queue ordered by key (Config.Declare) sends each message to the lane
// of its key, in the order published, delayed ones included; a message without a key is
// refused, permanently, before anything is sent.
func TestOrderedQueueRoutesByKey(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("ordered")
	const lanes = 3
	var laneQueues []string
	for i := range lanes {
		laneQueues = append(laneQueues, topology.LaneQueue(q, i), topology.HeldQueue(q, i))
	}
	env.Remove(laneQueues, nil)
	p := newPublisher(t, env, func(c *dlx.Config) {
		c.Declare = topology.Topology{Queues: []topology.Queue{{Name: q, Lanes: lanes}}}
	})

	want := make([][]string, lanes) // the ids of each lane, in publish order
	var msgs []*message.Message
	for i := range 12 {
		key := fmt.Sprintf("key-%d", i%5)
		msg := message.NewMessage(fmt.Sprintf("m%02d-%s", i, key), nil)
		warren.OrderBy(msg, key)
		msgs = append(msgs, msg)
		lane := topology.Lane(key, lanes)
		want[lane] = append(want[lane], msg.UUID)
	}
	for lane := range want {
		require.NotEmpty(t, want[lane], "every lane gets some of the keys")
	}
	require.NoError(t, p.Publish(q, msgs...))
	delayed := message.NewMessage("delayed-key-1", nil)
	warren.OrderBy(delayed, "key-1")
	warren.Delay(delayed, 30*time.Millisecond)
	require.NoError(t, p.Publish(q, delayed))
	want[topology.Lane("key-1", lanes)] = append(want[topology.Lane("key-1", lanes)], delayed.UUID)

	for lane, ids := range want {
		got := consume(t, env, topology.LaneQueue(q, lane), len(ids))
		var gotIDs []string
		for _, a := range got {
			gotIDs = append(gotIDs, a.msg.UUID)
			assert.Equal(t, strings.SplitN(a.msg.UUID, "-", 2)[1], warren.OrderKey(a.msg), "the key travels as a header")
		}
		assert.Equal(t, ids, gotIDs, "lane %d", lane)
	}
	assert.Zero(t, env.Messages(q), "nothing in the queue itself")

	keyless := message.NewMessage(watermill.NewUUID(), nil)
	err := p.Publish(q, keyless)
	require.ErrorIs(t, err, warren.ErrNoOrderKey)
	assert.True(t, warren.IsPermanent(err))
	assert.ErrorContains(t, err, keyless.UUID)
}
