package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/ledger"
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
	dlx.Delay(msg, 365*24*time.Hour)
	dlx.Schedule(msg, "")
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
