package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/ledger"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// A reminder a year ahead: listed with its destination and due time, cancelled, and then
// no longer listed; a second list filters by topic and due time.
func TestScheduledListAndCancel(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	// Radix 2, 1 s unit: 23 levels reach 97 days, and a chain of 4 a year and more (27 queues).
	delay := env.Delay(topology.Delay{Radix: 2, Unit: time.Second, Levels: 23, Reach: 400 * 24 * time.Hour})
	q := env.Queue("reminders")
	pub, err := dlx.NewPublisher(dlx.Config{Connection: env.Connection(), Topology: topology.Config{Delay: delay}}, env.Logger())
	require.NoError(t, err)
	defer pub.Close()
	msg := message.NewMessage("renewal-42", []byte("renew"))
	warren.Delay(msg, 365*24*time.Hour)
	warren.Schedule(msg, "")
	require.NoError(t, pub.Publish(q, msg))
	flags := []string{"--prefix", delay.Prefix, "--radix", "2", "--unit", "1s", "--levels", "23", "--reach", "9600h"}
	assert.Contains(t, run(t, env.URL, append([]string{"delays", "apply", "--ledger"}, flags...)...), "declared the ledger "+delay.LedgerQueue())

	var entries []ledger.Entry
	require.NoError(t, json.Unmarshal([]byte(run(t, env.URL, append([]string{"scheduled", "list", "--json"}, flags...)...)), &entries))
	require.Len(t, entries, 1)
	assert.Equal(t, "renewal-42", entries[0].ID)
	assert.Equal(t, q, entries[0].Queue)
	assert.WithinDuration(t, time.Now().Add(365*24*time.Hour), entries[0].Due, time.Minute)

	out := run(t, env.URL, append([]string{"scheduled", "list", "--topic", q, "--before", "+8761h"}, flags...)...)
	assert.Contains(t, out, "renewal-42  "+q+"  -  ")
	assert.Contains(t, out, "1 message scheduled")
	out = run(t, env.URL, append([]string{"scheduled", "list", "--before", "+24h"}, flags...)...)
	assert.Contains(t, out, "0 messages scheduled")

	assert.Contains(t, run(t, env.URL, append([]string{"scheduled", "cancel", "renewal-42"}, flags...)...), "cancelled renewal-42")
	assert.Contains(t, run(t, env.URL, append([]string{"scheduled", "list"}, flags...)...), "0 messages scheduled")

	// From the CLI alone: publish a year ahead, list, cancel.
	out = runIn(t, env.URL, "renew", append([]string{"publish", q, "--at", "+8760h", "--schedule"}, flags...)...)
	require.Contains(t, out, "scheduled under id ")
	id := strings.TrimSuffix(strings.Fields(strings.SplitAfter(out, "scheduled under id ")[1])[0], ":")
	assert.Contains(t, run(t, env.URL, append([]string{"scheduled", "list"}, flags...)...), id+"  "+q)
	assert.Contains(t, run(t, env.URL, append([]string{"scheduled", "cancel", id}, flags...)...), "cancelled "+id)
	_, stderr, code := runCode(t, env.URL, append([]string{"publish", q, "--schedule"}, flags...)...)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "--schedule needs --delay or --at")
	_, stderr, code = runCode(t, env.URL, append([]string{"scheduled", "cancel", "nosuch"}, flags...)...)
	assert.Equal(t, exitNoQueue, code)
	assert.Contains(t, stderr, "no message is scheduled under this id")
}

// Ids that a JSON string or a shell argument cannot hold as they are: the first of each pair
// is cancelled from what `scheduled list` prints (the table's form, or --json's id_base64),
// and only the second of each pair is handled.
func TestScheduledIDsThroughTheCLI(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	delay := env.Delay(topology.Delay{})
	flags := []string{"--prefix", delay.Prefix, "--radix", strconv.Itoa(delay.Radix), "--levels", strconv.Itoa(delay.Levels)}
	q := env.Queue("exact")
	pairs := [][2]string{
		{"order-7\xff", "order-7\xfe"}, // differ only in a byte that is not UTF-8
		{"tick\x00", "tick\ufffd"},     // NUL and U+FFFD
		{"bad\xff", "bad\ufffd"},       // a byte that is not UTF-8 and U+FFFD itself
		{"ctl\u009b", "ctl\x9b"},       // a C1 control, and its code as a lone byte
		{`"quoted"`, "it's 2"},         // quotes and a space: printed quoted too
	}
	pub, err := dlx.NewPublisher(dlx.Config{Connection: env.Connection(), Topology: topology.Config{Delay: delay}}, env.Logger())
	require.NoError(t, err)
	defer pub.Close()
	var all, kept []string
	for _, p := range pairs {
		for _, id := range p {
			msg := message.NewMessage(id, []byte(id))
			warren.Delay(msg, time.Second) // they wait in the queue until the consumer starts
			warren.Schedule(msg, "")
			require.NoError(t, pub.Publish(q, msg))
		}
		all, kept = append(all, p[0], p[1]), append(kept, p[1])
	}

	// The table: one row per id, in a form that reads back as the id.
	out := run(t, env.URL, append([]string{"scheduled", "list", "--topic", q}, flags...)...)
	forms := map[string]string{} // id: its form in the table
	for _, line := range strings.Split(out, "\n") {
		if form, _, ok := strings.Cut(line, "  "+q+"  "); ok {
			form = strings.TrimRight(form, " ")
			id, err := parseID(form)
			require.NoError(t, err, form)
			forms[id] = form
		}
	}
	assert.ElementsMatch(t, all, slices.Collect(maps.Keys(forms)), out)
	assert.Contains(t, out, `"tick\x00"  `)
	assert.Contains(t, out, `"order-7\xff"  `)
	assert.Contains(t, out, `"tick\ufffd"  `)
	assert.Contains(t, out, `"ctl\u009b"  `)

	// --json: exact through id_base64; the first pair is cancelled from it.
	var entries []ledger.Entry
	listed := run(t, env.URL, append([]string{"scheduled", "list", "--json", "--topic", q}, flags...)...)
	require.NoError(t, json.Unmarshal([]byte(listed), &entries))
	var exact []string
	for _, e := range entries {
		exact = append(exact, e.ID)
	}
	assert.ElementsMatch(t, all, exact)
	var raw []map[string]any
	require.NoError(t, json.Unmarshal([]byte(listed), &raw))
	b64 := ""
	for _, r := range raw {
		if r["id_base64"] == base64.StdEncoding.EncodeToString([]byte(pairs[0][0])) {
			b64 = r["id_base64"].(string)
		}
	}
	require.NotEmpty(t, b64, listed)
	assert.Contains(t, run(t, env.URL, append([]string{"scheduled", "cancel", "--base64", b64}, flags...)...),
		`cancelled "order-7\xff": it will not be handled`)
	for _, p := range pairs[1:] {
		assert.Contains(t, run(t, env.URL, append([]string{"scheduled", "cancel", forms[p[0]]}, flags...)...), "cancelled "+forms[p[0]]+":")
	}
	require.NoError(t, json.Unmarshal([]byte(run(t, env.URL, append([]string{"scheduled", "list", "--json", "--topic", q}, flags...)...)), &entries))
	exact = exact[:0]
	for _, e := range entries {
		exact = append(exact, e.ID)
	}
	assert.ElementsMatch(t, kept, exact, "the second of each pair waits")

	// Consumed: only the second of each pair is handled.
	l, err := ledger.New(ledger.Config{Connection: env.Connection(), Delay: delay}, env.Logger())
	require.NoError(t, err)
	defer l.Close()
	r, err := router.New(router.Config{Connection: env.Connection(), Topology: topology.Config{Delay: delay}}, env.Logger())
	require.NoError(t, err)
	var (
		mu      sync.Mutex
		handled []string
	)
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: q, Middleware: []message.HandlerMiddleware{l.Middleware}},
		func(msg *message.Message) error {
			mu.Lock()
			handled = append(handled, string(msg.Payload))
			mu.Unlock()
			return nil
		}))
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); assert.NoError(t, r.Run(ctx)) }()
	defer func() { stop(); <-done }()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(handled) }
	require.Eventually(t, func() bool { return count() == len(kept) }, testenv.Patience(), 10*time.Millisecond)
	assert.Never(t, func() bool { return count() > len(kept) }, 500*time.Millisecond, 10*time.Millisecond, "a cancelled one handled")
	mu.Lock()
	assert.ElementsMatch(t, kept, handled)
	mu.Unlock()

	// A cancel after the delivery, of an unknown id, of a quoted form that is not one.
	_, stderr, code := runCode(t, env.URL, append([]string{"scheduled", "cancel", `"tick\ufffd"`}, flags...)...)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `delivered before the cancellation: "tick\ufffd"`)
	_, stderr, code = runCode(t, env.URL, append([]string{"scheduled", "cancel", `"never\x00"`}, flags...)...)
	assert.Equal(t, exitNoQueue, code)
	assert.Contains(t, stderr, `no message is scheduled under this id: "never\x00"`)
	_, stderr, code = runCode(t, env.URL, append([]string{"scheduled", "cancel", `"tick\x00`}, flags...)...)
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "read as a quoted id")
}
