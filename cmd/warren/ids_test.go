package main

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/internal/visible"
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

// Every id, whatever its bytes, is printed in a form that reads back as it (and as nothing
// else), that passes through visible unchanged, and that pasted between single quotes is one
// shell argument; a plain id is printed as it is.
func TestIDFormsRoundTrip(t *testing.T) {
	ids := []string{"plain-42", "order-42/a.b_c:d@e", "ünïcode", "", " ", "a b", `"quoted"`, `"`, "it's", `back\slash`,
		"tick\x00", "order-7\xff", "order-7\xfe", "\ufffd", "\xef\xbf\xbd\xff", "ctl\u009b", "ctl\x9b", "del\x7f",
		"\x1b[2J", "tab\tnl\n", "\u2028", "\u200b", "\xc3\x28", "\\x00", `\ufffd`, "\u00a0nbsp"}
	for range 2000 {
		b := make([]byte, rand.IntN(10))
		for i := range b {
			b[i] = byte(rand.Uint32())
		}
		ids = append(ids, string(b))
		r := make([]rune, rand.IntN(4))
		for i := range r {
			r[i] = rand.Int32N(0x110000)
		}
		ids = append(ids, string(r))
	}
	seen := map[string]string{}
	for _, id := range ids {
		form := showID(id)
		back, err := parseID(form)
		require.NoError(t, err, "%q as %s", id, form)
		assert.Equal(t, id, back, "%q as %s", id, form)
		assert.Equal(t, form, visible.String(form), "%q", id)
		assert.NotContains(t, form, "'", "%q", id)
		if other, ok := seen[form]; ok {
			assert.Equal(t, other, id, "two ids printed as %s", form)
		}
		seen[form] = id
	}
	for _, id := range []string{"plain-42", "order-42/a.b_c:d@e", "ünïcode", "f47ac10b-58cc-4372-a567-0e02b2c3d479"} {
		assert.Equal(t, id, showID(id), "plain: as it is")
	}
	assert.Equal(t, `"tick\x00"`, showID("tick\x00"))
	assert.Equal(t, `"order-7\xff"`, showID("order-7\xff"))
	assert.Equal(t, `"\ufffd"`, showID("\ufffd"))
	assert.Equal(t, `"it\x27s"`, showID("it's"))
	assert.Equal(t, `"`+hostileShown+`"`, showID(hostile), "escaped as visible escapes")
	assert.Equal(t, `"\U000e0001\u2028 \\ \""`, showID("\U000e0001\u2028 \\ \""))
	_, err := parseID(`"unterminated`)
	assert.ErrorContains(t, err, "read as a quoted id")
}

// A poison message whose id holds NUL, and another whose id is not UTF-8, beside one whose
// id holds U+FFFD: list shows each in a form of its own, and replay --id with that form
// replays that message alone.
func TestPoisonIDsThatAreNotText(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.Queue("notext")
	poisonQueue(t, env, q, message.NewMessage("pay\x00", []byte("nul")), message.NewMessage("pay\xff", []byte("ff")),
		message.NewMessage("pay\ufffd", []byte("fffd")))

	out := run(t, env.URL, "poison", "list", q)
	for _, form := range []string{`"pay\x00"`, `"pay\xff"`, `"pay\ufffd"`} {
		assert.Contains(t, out, " "+form+" ", out)
	}
	assert.Regexp(t, `replayed 1 message `, run(t, env.URL, "poison", "replay", q, "--id", `"pay\xff"`))
	assert.Regexp(t, `replayed 1 message `, run(t, env.URL, "poison", "replay", q, "--id", `"pay\x00"`))
	var ids []string
	for range 2 {
		d, ok, err := env.Channel().Get(q, true)
		require.NoError(t, err)
		require.True(t, ok)
		ids = append(ids, contract.DeliveryID(d))
	}
	assert.Equal(t, []string{"pay\xff", "pay\x00"}, ids)
	var left []ops.Message
	require.NoError(t, json.Unmarshal([]byte(run(t, env.URL, "poison", "list", q, "--json")), &left))
	require.Len(t, left, 1)
	assert.Equal(t, "pay\ufffd", left[0].ID)
}
