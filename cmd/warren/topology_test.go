package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// runIn is run with stdin.
func runIn(t *testing.T, url, stdin string, args ...string) string {
	t.Helper()
	root := newRoot()
	var out syncBuffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(cliArgs(url, args...))
	require.NoError(t, root.Execute(), out.String())
	return out.String()
}

// writeFile writes a topology file of the test's own: an exchange, a work queue with
// delivery limit limit bound to it, and delay levels d.
func writeFile(t *testing.T, d topology.Delay, exchange, queue string, limit int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "topology.yaml")
	data := fmt.Sprintf(`config:
  delay: {prefix: %s, levels: %d}
exchanges:
  - {name: %s, kind: topic}
queues:
  - {name: %s, delivery_limit: %d}
bindings:
  - {exchange: %s, queue: %s, key: "order.*"}
`, d.Prefix, d.Levels, exchange, queue, limit, exchange, queue)
	require.NoError(t, os.WriteFile(path, []byte(data), 0o600))
	return path
}

// Apply, then verify: OK, as text and JSON; verify with another delivery limit names the
// argument and fails.
func TestTopologyApplyVerify(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	d, x, q := cliDelay(env), env.Exchange("events"), env.Queue("billing")
	file := writeFile(t, d, x, q, 20)

	out := run(t, env.URL, "topology", "apply", file)
	assert.Equal(t, fmt.Sprintf("applied %s: 1 exchange, 1 work queue (each with its poison queue and kill exchange), 1 binding; "+
		"delay levels %s (60 quorum queues: 4 levels, radix 16, unit 1ms; delays up to 1m5s)\n", file, d.Name()), out)
	assert.Equal(t, "ok\n(68 bindings not checked: AMQP 0-9-1 cannot tell whether a binding exists; apply declares them)\n",
		run(t, env.URL, "topology", "verify", file))
	var report reportJSON
	require.NoError(t, json.Unmarshal([]byte(run(t, env.URL, "topology", "verify", file, "--json")), &report))
	assert.Equal(t, reportJSON{OK: true, Missing: []string{}, Differs: []differsJSON{}, Unchecked: report.Unchecked, Unresolved: []string{}}, report)
	assert.Len(t, report.Unchecked, 68)

	changed := writeFile(t, d, x, q, 7)
	out, err := cli("--url", env.URL, "topology", "verify", changed)
	require.Error(t, err)
	assert.Contains(t, out, fmt.Sprintf("differs: queue %q: argument x-delivery-limit: declare it as it is", q))
	assert.Contains(t, out, "Error: "+changed+": 0 missing, 1 with other arguments")
	out, err = cli("--url", env.URL, "topology", "verify", changed, "--json")
	require.Error(t, err)
	require.NoError(t, json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &report))
	assert.False(t, report.OK)
	require.Len(t, report.Differs, 1)
	assert.Equal(t, "x-delivery-limit", report.Differs[0].Argument)
	assert.Equal(t, q, report.Differs[0].Name)

	out, err = cli("--url", env.URL, "topology", "apply", changed)
	require.Error(t, err)
	assert.Contains(t, out, fmt.Sprintf("topology: queue %q exists with a different argument x-delivery-limit", q))
}

// verify on a broker without the topology says how many exchanges and queues are missing and
// what to run, lists each with -v, and fails.
func TestTopologyVerifyMissing(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	d, x, q := cliDelay(env), env.Exchange("events"), env.Queue("billing")
	file := writeFile(t, d, x, q, 20)
	out, err := cliErr(env.URL, "topology", "verify", file)
	require.Error(t, err)
	assert.Equal(t, "missing: 61 queues and 6 exchanges of delay levels "+d.Name()+" (none declared): run `warren topology apply "+file+"`\n"+
		"missing: 2 queues and 2 exchanges of "+file+": run `warren topology apply "+file+"` (-v lists each)\n"+
		"(68 bindings not checked: AMQP 0-9-1 cannot tell whether a binding exists; apply declares them)\n"+
		"Error: "+file+": 71 missing, 0 with other arguments\n", out)

	out, err = cli("--url", env.URL, "topology", "verify", file, "-v")
	require.Error(t, err)
	assert.Contains(t, out, fmt.Sprintf("missing: queue %q\n", q))
	assert.Contains(t, out, fmt.Sprintf("missing: exchange %q\n", topology.KillExchange(q)))
	assert.Contains(t, out, fmt.Sprintf("missing: queue %q\n", d.LevelQueue(3, 15)))
	assert.Contains(t, out, "Error: "+file+": 71 missing, 0 with other arguments")
}

func TestTopologyFileErrors(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(path, []byte("queues:\n  - {name: q, delivery_limt: 3}\n"), 0o600))
	for _, cmd := range []string{"apply", "verify", "diagram"} {
		out, err := cli("topology", cmd, path)
		require.Error(t, err, cmd)
		assert.Contains(t, out, "Error: "+path+": topology: yaml: unmarshal errors:\n  line 2: field delivery_limt not found in type topology.Queue", cmd)
	}
	_, err := cli("topology", "diagram", "../../examples/topology/topology.yaml", "--format", "svg")
	assert.ErrorContains(t, err, `--format "svg" is neither mermaid nor dot`)
}

// The diagrams of the example file are topology's, printed as they are.
func TestTopologyDiagram(t *testing.T) {
	t.Parallel()
	const example = "../../examples/topology/topology.yaml"
	f, err := topology.Load(example)
	require.NoError(t, err)
	out, err := cli("topology", "diagram", example)
	require.NoError(t, err)
	assert.Equal(t, topology.Mermaid(f.Config, f.Topology), out)
	assert.True(t, strings.HasPrefix(out, "flowchart LR\n"), out)
	out, err = cli("topology", "diagram", example, "--format", "dot")
	require.NoError(t, err)
	assert.Equal(t, topology.DOT(f.Config, f.Topology), out)
}

// delays verify fails before apply and passes after; remove refuses while a message waits,
// saying how many and where, and --force removes them.
func TestDelaysApplyVerifyRemove(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	d := env.Delay(topology.Delay{Levels: 2})
	flags := []string{"--prefix", d.Prefix, "--levels", "2"}
	delays := func(args ...string) (string, error) {
		return cli(append(append([]string{"--url", env.URL, "delays"}, args...), flags...)...)
	}

	out, err := delays("verify")
	require.Error(t, err)
	assert.Equal(t, "missing: 31 queues and 4 exchanges of delay levels "+d.Name()+" (none declared): "+
		"run `warren delays apply` with the same delay level flags (-v lists each)\n"+
		"(33 bindings not checked: AMQP 0-9-1 cannot tell whether a binding exists; apply declares them)\n"+
		"Error: delay levels "+d.Name()+": 35 missing, 0 with other arguments\n", strings.TrimSuffix(out, "\n"+err.Error()))
	out, err = delays("verify", "-v")
	require.Error(t, err)
	assert.Contains(t, out, fmt.Sprintf("missing: queue %q\n", d.ParkingQueue()))

	out, err = delays("apply")
	require.NoError(t, err, out)
	assert.Equal(t, "declared delay levels "+d.Name()+" (30 quorum queues: 2 levels, radix 16, unit 1ms; delays up to 255ms)\n", out)
	out, err = delays("verify")
	require.NoError(t, err, out)
	assert.Equal(t, "ok\n(33 bindings not checked: AMQP 0-9-1 cannot tell whether a binding exists; apply declares them)\n", out)
	out, err = delays("verify", "--queue-type", "classic")
	require.Error(t, err)
	assert.Contains(t, out, "missing: 31 queues and 4 exchanges of delay levels "+strings.Replace(d.Name(), ".quorum.", ".classic.", 1)+" (none declared)")

	// A few missing are listed.
	_, err = env.Channel().QueueDelete(d.LevelQueue(1, 15), false, false, false)
	require.NoError(t, err)
	out, err = delays("verify")
	require.Error(t, err)
	assert.Equal(t, fmt.Sprintf("missing: queue %q\n", d.LevelQueue(1, 15))+
		"(33 bindings not checked: AMQP 0-9-1 cannot tell whether a binding exists; apply declares them)\n"+
		"Error: delay levels "+d.Name()+": 1 missing, 0 with other arguments\n", strings.TrimSuffix(out, "\n"+err.Error()))
	out, err = delays("apply")
	require.NoError(t, err, out)

	removed := "removed delay levels " + d.Name() + ": 31 queues (0 did not exist) and their 4 exchanges\n"
	out, err = delays("remove")
	require.NoError(t, err, out)
	assert.Equal(t, removed, out, "empty levels are removed without --force")
	_, err = env.Inspect(d.LevelQueue(1, 15))
	assert.ErrorContains(t, err, "NOT_FOUND")

	out, err = delays("apply")
	require.NoError(t, err, out)
	// A parked message stays (no consumer, no TTL): remove refuses for it.
	require.NoError(t, env.Channel().Publish("", d.ParkingQueue(), false, false, amqp.Publishing{Body: []byte("parked")}))
	require.Eventually(t, func() bool { return env.Messages(d.ParkingQueue()) == 1 }, testenv.Patience(), 10*time.Millisecond)
	out, err = delays("remove")
	require.Error(t, err)
	assert.Contains(t, out, "Error: remove delay levels "+d.Name()+": refused: 1 message waits in delay levels "+d.Name()+" ("+d.ParkingQueue()+": 1) and would be lost")
	out, err = delays("verify")
	require.NoError(t, err, "a refused remove removes nothing: %s", out)

	out, err = delays("remove", "--force")
	require.NoError(t, err, out)
	assert.Equal(t, removed+"deleted 1 message with them\n", out)
	_, err = env.Inspect(d.ParkingQueue())
	assert.ErrorContains(t, err, "NOT_FOUND")
	out, err = delays("remove")
	require.NoError(t, err, out)
	assert.Equal(t, "no queue of delay levels "+d.Name()+" exists; deleted their 4 exchanges, if any\n", out)
}

func TestDelaysFlagsOrConfig(t *testing.T) {
	t.Parallel()
	_, err := cli("delays", "verify", "--config", "../../examples/topology/topology.yaml", "--radix", "4")
	assert.ErrorContains(t, err, "--radix and --config: give one")
	_, err = cli("delays", "apply", "--unit", "1500us")
	assert.ErrorContains(t, err, "Delay.Unit 1.5ms is not a whole number of milliseconds")
	_, err = cli("delays", "apply", "--queue-type", "stream")
	assert.ErrorContains(t, err, `Delay.QueueType "stream" is neither`)
}

// --at +D counts from the publish, not from the command's start: a broker that answers the
// command only seconds later still gets the message, due D after it was published.
func TestPublishAtCountsFromThePublish(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	d, x, q := cliDelay(env), env.Exchange("events"), env.Queue("late")
	run(t, env.URL, "topology", "apply", writeFile(t, d, x, q, 20))
	deliveries, err := env.Channel().Consume(q, "", true, false, false, false, nil)
	require.NoError(t, err)

	proxy, url := testenv.ProxyURL(t, env.URL)
	start := time.Now()
	proxy.Freeze() // the command's connections wait 2.5 s for an answer
	time.AfterFunc(2500*time.Millisecond, proxy.Thaw)
	out := runIn(t, url, "late", "publish", q, "--at", "+1s", "--prefix", d.Prefix, "--levels", strconv.Itoa(d.Levels))
	published := time.Now()
	m := regexp.MustCompile(`; due (\S+) `).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	due, err := time.Parse(time.RFC3339Nano, m[1])
	require.NoError(t, err)
	assert.False(t, due.Before(start.Add(2500*time.Millisecond+time.Second)) || due.After(published.Add(time.Second)),
		"due %s: 1 s after the publish, between %s and %s", due, start.Add(2500*time.Millisecond), published)
	select {
	case m := <-deliveries:
		assert.False(t, time.Now().Before(due), "delivered before it was due")
		assert.Equal(t, "late", string(m.Body))
	case <-time.After(testenv.Patience()):
		t.Fatal("the message did not arrive")
	}
}

// A message published with --delay reaches its queue no earlier than the delay, with its
// headers, body and the printed id.
func TestPublishDelayed(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	d, x, q := cliDelay(env), env.Exchange("events"), env.Queue("billing")
	run(t, env.URL, "topology", "apply", writeFile(t, d, x, q, 20))
	deliveries, err := env.Channel().Consume(q, "", true, false, false, false, nil)
	require.NoError(t, err)

	const delay = 300 * time.Millisecond
	start := time.Now()
	out := runIn(t, env.URL, `{"order": 7}`, "publish", q, "--delay", delay.String(), "--header", "tenant=acme", "--header", "k=v=w",
		"--prefix", d.Prefix, "--levels", strconv.Itoa(d.Levels))
	id := strings.Fields(out)[2]
	assert.Regexp(t, `^published message \S+ to queue "`+q+`"; due \S+ \(in 300ms; through delay levels `+d.Name()+`\)\n$`, out)
	select {
	case m := <-deliveries:
		assert.GreaterOrEqual(t, time.Since(start), delay, "delivered before the delay")
		assert.Equal(t, id, m.MessageId)
		assert.Equal(t, `{"order": 7}`, string(m.Body))
		assert.Equal(t, "acme", m.Headers["tenant"])
		assert.Equal(t, "v=w", m.Headers["k"])
	case <-time.After(testenv.Patience()):
		t.Fatal("the delayed message did not arrive")
	}

	// --at, to the exchange with TOPIC as the routing key, body from --file.
	body := filepath.Join(t.TempDir(), "body")
	require.NoError(t, os.WriteFile(body, []byte("paid"), 0o600))
	// Seconds ahead: the CLI refuses a time more than 1 s past, and on a loaded machine its
	// checks before the publish can take longer than that; refused so, it is tried further ahead.
	var at time.Time
	for ahead := 3 * time.Second; ; ahead *= 2 {
		at = time.Now().Add(ahead)
		stdout, stderr, code := runCode(t, env.URL, "publish", "order.paid", "--exchange", x, "--at", at.Format(time.RFC3339Nano),
			"--file", body, "--prefix", d.Prefix, "--levels", strconv.Itoa(d.Levels))
		if code == 0 {
			out = stdout
			break
		}
		require.Contains(t, stderr, "in the past", stdout)
		require.Less(t, ahead, testenv.Patience(), stderr)
	}
	assert.Contains(t, out, fmt.Sprintf(`to exchange %q with routing key "order.paid"; due %s`, x, at.UTC().Format(time.RFC3339Nano)))
	select {
	case m := <-deliveries:
		assert.False(t, time.Now().Before(at), "delivered before --at")
		assert.Equal(t, "paid", string(m.Body))
		assert.Equal(t, "order.paid", m.RoutingKey)
	case <-time.After(testenv.Patience()):
		t.Fatal("the message for --at did not arrive")
	}

	// A delay below the unit of the delay levels says what it was rounded up to.
	out = runIn(t, env.URL, "fine", "publish", q, "--delay", "1.5ms", "--prefix", d.Prefix, "--levels", strconv.Itoa(d.Levels))
	assert.Regexp(t, `^published message \S+ to queue "`+q+`"; due \S+ \(in 2ms: --delay 1.5ms rounded up to the unit `+
		`of the delay levels, 1ms; through delay levels `+d.Name()+`\)\n$`, out)
	select {
	case m := <-deliveries:
		assert.Equal(t, "fine", string(m.Body))
	case <-time.After(testenv.Patience()):
		t.Fatal("the message for --delay 1.5ms did not arrive")
	}

	// --at +D: D from now.
	start = time.Now()
	out = runIn(t, env.URL, "soon", "publish", q, "--at", "+3s", "--prefix", d.Prefix, "--levels", strconv.Itoa(d.Levels))
	assert.Regexp(t, `^published message \S+ to queue "`+q+`"; due \S+ `, out)
	select {
	case m := <-deliveries:
		assert.GreaterOrEqual(t, time.Since(start), delay, "delivered before --at +D")
		assert.Equal(t, "soon", string(m.Body))
	case <-time.After(testenv.Patience()):
		t.Fatal("the message for --at +D did not arrive")
	}
}

// Without a delay the message is there when publish returns (confirmed); a destination or
// delay levels that do not exist are errors, and nothing is declared.
func TestPublishNowAndRefusals(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	d, x, q := cliDelay(env), env.Exchange("events"), env.Queue("billing")
	run(t, env.URL, "topology", "apply", writeFile(t, d, x, q, 20))

	out := runIn(t, env.URL, "now", "publish", q)
	assert.Regexp(t, `^published message \S+ to queue "`+q+`"; delivered now\n$`, out)
	assert.Equal(t, 1, env.Messages(q), "confirmed: in the queue when publish returns")

	missing := env.Queue("missing")
	out, err := cli("--url", env.URL, "publish", missing, "--file", "/dev/null")
	require.Error(t, err)
	assert.Contains(t, out, fmt.Sprintf("queue %q does not exist (warren publish declares nothing)", missing))
	_, err = env.Inspect(missing)
	assert.ErrorContains(t, err, "NOT_FOUND", "publish declared the queue")

	out, err = cli("--url", env.URL, "publish", q, "--delay", "1s", "--prefix", d.Prefix+".other", "--file", "/dev/null")
	require.Error(t, err)
	assert.Contains(t, out, "the delay levels "+d.Prefix+".other.quorum.1ms.r16 are not declared")

	for args, want := range map[string]string{
		"--delay 2m":          "--delay: topology: delay 2m0s: delay exceeds the maximum of the delay levels 1m5.535s",
		"--delay -1s":         "--delay -1s is negative",
		"--at tomorrow":       `--at: "tomorrow" is neither an RFC 3339 time (2026-01-02T15:04:05Z) nor +D`,
		"--at +3x":            `--at: "+3x" is not +D or -D, a Go duration from now (+3s, -2h30m)`,
		"--delay 1s --at x":   "if any flags in the group [delay at] are set none of the others can be",
		"--header novalue":    `--header "novalue" is not key=value`,
		"--file /nonexisting": "--file: open /nonexisting",
	} {
		_, err := cli(append([]string{"--url", env.URL, "publish", q, "--levels", "4", "--prefix", d.Prefix}, strings.Fields(args)...)...)
		assert.ErrorContains(t, err, want, args)
	}
}

// verify and apply check the file first: a binding to a queue that the file does not declare
// and the broker does not have fails verify and stops apply before it declares anything; a
// delivery limit on a classic queue is an error naming it.
func TestTopologyFileConsistency(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	d, x, q, typo := cliDelay(env), env.Exchange("events"), env.Queue("billing"), env.Queue("biling")
	path := filepath.Join(t.TempDir(), "topology.yaml")
	data := fmt.Sprintf("config:\n  delay: {prefix: %s, levels: %d}\nexchanges: [{name: %s}]\nqueues: [{name: %s}]\n"+
		"bindings:\n  - {exchange: %s, queue: %s}\n  - {exchange: %s, queue: %s}\n", d.Prefix, d.Levels, x, q, x, q, x, typo)
	require.NoError(t, os.WriteFile(path, []byte(data), 0o600))

	unresolved := fmt.Sprintf("Bindings[1].Queue: queue %q is declared neither by the topology nor on the broker", typo)
	out, err := cli("--url", env.URL, "topology", "apply", path)
	require.Error(t, err)
	assert.Contains(t, out, "Error: topology: apply: topology: nothing declared: "+unresolved)
	_, err = env.Inspect(q)
	assert.ErrorContains(t, err, "NOT_FOUND", "apply declared the file's queue")

	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(data, "queue: "+typo, "queue: "+q, 1)), 0o600))
	run(t, env.URL, "topology", "apply", path)
	require.NoError(t, os.WriteFile(path, []byte(data), 0o600))
	out, err = cli("--url", env.URL, "topology", "verify", path)
	require.Error(t, err)
	assert.Contains(t, out, "unresolved: "+unresolved+"\n")
	assert.Contains(t, out, "Error: "+path+": 0 missing, 0 with other arguments, 1 binding to names declared nowhere")
	out, err = cli("--url", env.URL, "topology", "verify", path, "--json")
	require.Error(t, err)
	var report reportJSON
	require.NoError(t, json.Unmarshal([]byte(out[:strings.LastIndex(out, "}")+1]), &report))
	assert.Equal(t, []string{unresolved}, report.Unresolved)
	assert.False(t, report.OK)

	classic := filepath.Join(t.TempDir(), "classic.yaml")
	require.NoError(t, os.WriteFile(classic, []byte("queues: [{name: q, type: classic, delivery_limit: 5}]\n"), 0o600))
	for _, cmd := range []string{"apply", "verify"} {
		_, err = cli("--url", env.URL, "topology", cmd, classic)
		assert.ErrorContains(t, err, `Queues[0].DeliveryLimit 5: queue "q" is classic, which has no delivery limit`, cmd)
	}
}
