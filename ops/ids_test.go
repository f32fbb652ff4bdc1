package ops_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
)

// longID is an id longer than the 255 bytes of an AMQP message-id: the Marshaler carries it
// in a header.
var longID = strings.Repeat("order-42/", 40)

// poisonLong publishes a poison message of queue whose id is id, as the Marshaler writes it.
func poisonLong(t *testing.T, env *testenv.Env, queue, id string) {
	t.Helper()
	msg := message.NewMessage(id, []byte("long"))
	msg.Metadata.Set(warren.PoisonReasonKey, warren.PoisonReasonPermanent)
	msg.Metadata.Set(warren.PoisonQueueKey, queue)
	msg.Metadata.Set(warren.PoisonHandlerKey, "charge")
	p, err := warren.Marshaler{}.Marshal(msg)
	require.NoError(t, err)
	require.Empty(t, p.MessageId, "the id does not fit the message-id")
	require.NoError(t, env.Channel().PublishWithContext(context.Background(), "", topology.PoisonQueue(queue), true, false, p))
}

// A message whose id is longer than a message-id holds is listed with its id, found by it,
// and replayed with it.
func TestLongIDsAreShownFilteredAndReplayed(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("longid")
	fill(t, env, q, 2)
	poisonLong(t, env, q, longID)
	require.Eventually(t, func() bool { return env.Messages(topology.PoisonQueue(q)) == 3 }, testenv.Patience(), 10*time.Millisecond)
	o := newOps(t, env.URL, topology.Delay{})
	ctx := context.Background()

	all, err := o.Poisoned(ctx, q, ops.Browse{})
	require.NoError(t, err)
	require.Len(t, all, 3)
	assert.Equal(t, longID, all[2].ID)
	found, err := o.Poisoned(ctx, q, ops.Browse{Filter: ops.Filter{IDs: []string{longID}}})
	require.NoError(t, err)
	require.Len(t, found, 1)
	assert.Equal(t, 3, found[0].Position)

	res, err := o.ReplayPoisoned(ctx, q, ops.ReplayOptions{Filter: ops.Filter{IDs: []string{longID}}})
	require.NoError(t, err)
	assert.Equal(t, 1, res.Replayed)
	replayed := drain(t, env, q)
	require.Len(t, replayed, 1)
	msg, err := warren.Marshaler{}.Unmarshal(replayed[0])
	require.NoError(t, err)
	assert.Equal(t, longID, msg.UUID)
	assert.Equal(t, 2, env.Messages(topology.PoisonQueue(q)))
}
