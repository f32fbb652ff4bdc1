package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
)

// poisonQueue declares queue with its poison queue (no delay levels) and publishes msgs into
// the poison queue as the poison middleware writes them, with the Marshaler: given up on as a
// permanent error of handler "charge", unless their metadata say otherwise.
func poisonQueue(t *testing.T, env *testenv.Env, queue string, msgs ...*message.Message) {
	t.Helper()
	b, err := topology.NewBuilder(topology.Config{Delay: topology.Delay{Disabled: true}}, nil)
	require.NoError(t, err)
	require.NoError(t, b.DeclareQueue(context.Background(), env.Channel(), topology.Queue{Name: queue}))
	ch := env.Channel()
	require.NoError(t, ch.Confirm(false))
	for _, msg := range msgs {
		for k, v := range map[string]string{warren.PoisonReasonKey: warren.PoisonReasonPermanent,
			warren.PoisonQueueKey: queue, warren.PoisonHandlerKey: "charge"} {
			if msg.Metadata.Get(k) == "" {
				msg.Metadata.Set(k, v)
			}
		}
		p, err := warren.Marshaler{}.Marshal(msg)
		require.NoError(t, err)
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", topology.PoisonQueue(queue), true, false, p)
		require.NoError(t, err)
		ok, err := dc.WaitContext(context.Background())
		require.NoError(t, err)
		require.True(t, ok)
	}
}

// A poison message whose id is longer than a message-id holds: list shows it (cut, as every
// id), --json and export in full, --id finds it, replay --id sends it back with its id.
func TestLongIDThroughTheCLI(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.Queue("longid")
	long := strings.Repeat("order-42/", 40)
	poisonQueue(t, env, q, message.NewMessage("short", nil), message.NewMessage(long, []byte("long")))

	out := run(t, env.URL, "poison", "list", q)
	assert.Contains(t, out, "order-42/order-42/order-42/order-42…")
	var listed []ops.Message
	require.NoError(t, json.Unmarshal([]byte(run(t, env.URL, "poison", "list", q, "--json")), &listed))
	require.Len(t, listed, 2)
	assert.Equal(t, long, listed[1].ID)
	require.NoError(t, json.Unmarshal([]byte(run(t, env.URL, "poison", "list", q, "--json", "--id", long)), &listed))
	require.Len(t, listed, 1)
	assert.Equal(t, long, listed[0].ID)

	lines := strings.Split(strings.TrimSpace(run(t, env.URL, "poison", "export", q)), "\n")
	require.Len(t, lines, 2)
	var exported ops.Message
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &exported))
	assert.Equal(t, long, exported.ID)

	assert.Regexp(t, `replayed 1 messages? `, run(t, env.URL, "poison", "replay", q, "--id", long))
	d, ok, err := env.Channel().Get(q, true)
	require.NoError(t, err)
	require.True(t, ok)
	msg, err := warren.Marshaler{}.Unmarshal(d)
	require.NoError(t, err)
	assert.Equal(t, long, msg.UUID)
	assert.Equal(t, 1, env.Messages(topology.PoisonQueue(q)))
}
