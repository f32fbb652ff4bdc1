package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/outbox"
	"github.com/warrenmq/warren/topology"
)

// Without the management API, status says so in one line and, given no queue, how to name
// them; a broker version that one message can stop dead-lettering is warned about.
//
// Not parallel: it unsets $WARREN_MANAGEMENT_URL.
func TestStatusWithoutManagement(t *testing.T) {
	env := testenv.New(t)
	t.Setenv("WARREN_MANAGEMENT_URL", "")
	delay := cliDelay(env)
	out := run(t, env.URL, "status", "--prefix", delay.Prefix, "--levels", fmt.Sprint(delay.Levels))
	t.Log("\n" + out)
	assert.Contains(t, out, "no work queue named: give their names (warren status QUEUE...), a topology file (--config FILE),\n"+
		"or the management API (--management URL or $WARREN_MANAGEMENT_URL) to list warren's work queues\n")
	assert.Equal(t, 1, strings.Count(out, "management API: not given"), "one line")
	conn, _, err := amqpx.Dial(t.Context(), env.Connection(), "version")
	require.NoError(t, err)
	version := amqpx.ServerVersion(conn)
	_ = amqpx.Close(conn)
	if w := amqpx.DeadLetterWarning(version); w != "" {
		assert.Contains(t, out, "warning: "+w+"\n")
	} else {
		assert.NotContains(t, out, "warning:")
	}
}

// With the management API and no queue named, status lists warren's work queues, with their
// state, unacked messages and consumers' hosts. On a node whose dead-lettering a forged
// message stopped (3.10.8), a work queue declared afterwards shows as down (no count), the
// delayed message held in its level as dead-lettering, and `delays verify` fails on a level
// declared afterwards, which is down, and, without the management API too, on its probe of
// dead-lettering; on 4.0.5 all of them run and verify passes. On a
// throwaway node of its own.
func TestStatusListsWorkQueuesAndShowsWhatIsDown(t *testing.T) {
	node := testenv.StartNode(t, testenv.WithManagement())
	mg := node.ManagementURL()
	b, err := topology.NewBuilder(topology.Config{Delay: topology.Delay{Levels: 3}}, nil)
	require.NoError(t, err)
	d := b.Delay()
	levels := []string{"--levels", "3"}
	require.NoError(t, b.Apply(t.Context(), warren.Connection{URL: node.URL()}, topology.Topology{Queues: []topology.Queue{{Name: "cli.work"}}}))
	broken := node.BreakDeadLettering(d.LevelQueue(0, 1), "cli.work")
	// A work queue declared now, and a level queue deleted and declared again: refused once
	// (541) and left down on a broken node; then declared.
	run(t, node.URL(), "topology", "apply", writeFile(t, d, "cli.events", "cli.later", 20))
	_, err = node.Ctl("delete_queue", d.LevelQueue(1, 3))
	require.NoError(t, err)
	run(t, node.URL(), append([]string{"delays", "apply"}, levels...)...)

	var out string
	// The management API's statistics arrive every few seconds.
	require.Eventually(t, func() bool {
		out = run(t, node.URL(), append([]string{"status", "--management", mg}, levels...)...)
		return !strings.Contains(out, "unknown") && strings.Contains(out, "cli.later") &&
			(!broken || strings.Contains(out, "dead-lettering") && strings.Contains(out, "not running"))
	}, testenv.Patience(), 500*time.Millisecond, "last:\n%s", out)
	t.Logf("broken: %v\n%s", broken, out)
	assert.NotContains(t, out, "management API: not given")
	assert.NotContains(t, out, "no work queue named")
	assert.Regexp(t, regexp.MustCompile(`QUEUE\s+STATE\s+READY\s+UNACKED\s+CONSUMERS\s+KILL\s+POISON\s+CONSUMER HOSTS\n`), out)
	assert.Regexp(t, regexp.MustCompile(`\ncli.work\s+running\s+\d+\s+0\s+0\s+-\s+0\s+-\n`), out)
	assert.NotContains(t, out, ".poison ", "a poison queue is no work queue")
	vout, verr := cliErr(node.URL(), append([]string{"delays", "verify", "--management", mg}, levels...)...)
	t.Logf("delays verify: %v\n%s", verr, vout)
	if broken {
		assert.Contains(t, out, "warning: RabbitMQ ")
		assert.Regexp(t, regexp.MustCompile(`\ncli.later\s+down\s+-\s+-\s+0\s+-\s+0\s+-\n`), out)
		assert.Contains(t, out, "1 waiting, 0 parked, 1 dead-lettering, 1 of 45 level queues not running\n")
		assert.Contains(t, out, "  p0.d1 (1ms): 1 (1 dead-lettering)\n")
		assert.Contains(t, out, "  p1.d3 (48ms): down, its messages uncounted\n")
		require.Error(t, verr)
		assert.Contains(t, verr.Error(), "not running (management API): queue")
		assert.Contains(t, vout, "dead-lettering: the broker refused a quorum queue that dead-letters")
		assert.Contains(t, vout, fmt.Sprintf("not running: queue %q (down)\n", d.LevelQueue(1, 3)))
	} else {
		assert.NotContains(t, out, "warning:")
		assert.Regexp(t, regexp.MustCompile(`\ncli.later\s+running\s+0\s+0\s+0\s+-\s+0\s+-\n`), out)
		assert.NotContains(t, out, "down")
		require.NoError(t, verr)
	}
	// Without the management API too, verify's probe of dead-lettering sees it.
	pout, perr := cliErr(node.URL(), append([]string{"delays", "verify"}, levels...)...)
	t.Logf("delays verify without the management API: %v\n%s", perr, pout)
	if broken {
		require.Error(t, perr)
		assert.Contains(t, perr.Error(), "dead-lettering does not work")
		assert.Contains(t, pout, "dead-lettering: the broker refused a quorum queue that dead-letters")
	} else {
		require.NoError(t, perr)
	}
}

// setAside publishes n messages into the outbox of schema and sets the first one aside with
// reason, as a relay does when the broker will never take it.
func setAside(t *testing.T, pool *pgxpool.Pool, schema string, n int, reason string) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, outbox.Migrate(ctx, pool, schema))
	box, err := outbox.New(outbox.Config{Schema: schema}, nil)
	require.NoError(t, err)
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(fmt.Sprintf("m%d", i), nil)
	}
	require.NoError(t, box.Publish(ctx, pool, "orders", msgs...))
	_, err = pool.Exec(ctx, "UPDATE "+pgx.Identifier{schema, "outbox"}.Sanitize()+" SET set_aside = now(), reason = $1 "+
		"WHERE id = (SELECT min(id) FROM "+pgx.Identifier{schema, "outbox"}.Sanitize()+")", reason)
	require.NoError(t, err)
}

// With --postgres, status shows the outbox: the rows waiting and the oldest one's age, the
// relays, the inbox and the rows set aside with their reason; a row set aside, and rows that
// wait with no relay, are problems. Without it, nothing of the outbox is shown.
func TestStatusShowsTheOutbox(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	pool, schema := testenv.Postgres(t)
	setAside(t, pool, schema, 3, `NOT_FOUND - no exchange "gone" in vhost "/"`)
	q := env.WorkQueue("outbox")
	delay := cliDelay(env)
	args := []string{"status", q, "--prefix", delay.Prefix, "--levels", fmt.Sprint(delay.Levels)}
	pg := []string{"--postgres", testenv.PostgresURL(), "--schema", schema}

	out := run(t, env.URL, append(args, pg...)...)
	t.Log("\n" + out)
	assert.Contains(t, out, "  outbox "+schema+": 1 row set aside\n")
	assert.Contains(t, out, "  outbox "+schema+": 2 rows waiting and no relay connected\n")
	assert.Contains(t, out, "\noutbox "+schema+": 2 rows waiting, the oldest written ")
	assert.Contains(t, out, "; 1 row set aside (below; warren outbox replay once mended)\n"+
		"relays: none connected: nothing is published\n")
	assert.Regexp(t, regexp.MustCompile(`\nROW\s+TOPIC\s+UUID\s+SET ASIDE\s+REASON\n\d+\s+orders\s+m0\s+\S+\s+NOT_FOUND - no exchange "gone" in vhost "/"\n`), out)
	assert.Less(t, strings.Index(out, "delay levels"), strings.Index(out, "\noutbox "), "after the delay levels")

	var st struct {
		Queues []struct{ Queue string }
		Outbox *struct {
			Schema       string `json:"schema"`
			Waiting      int64  `json:"waiting"`
			OldestMS     *int64 `json:"oldest_ms"`
			SetAside     int64  `json:"set_aside"`
			Relays       *int   `json:"relays"`
			SetAsideRows []struct {
				ID     int64  `json:"id"`
				Topic  string `json:"topic"`
				Reason string `json:"reason"`
			} `json:"set_aside_rows"`
			Error string `json:"error"`
		} `json:"outbox"`
	}
	require.NoError(t, json.Unmarshal([]byte(run(t, env.URL, append(append(args, "--json"), pg...)...)), &st))
	require.NotNil(t, st.Outbox)
	assert.Equal(t, schema, st.Outbox.Schema)
	assert.Equal(t, int64(2), st.Outbox.Waiting)
	assert.Equal(t, int64(1), st.Outbox.SetAside)
	require.NotNil(t, st.Outbox.Relays)
	assert.Zero(t, *st.Outbox.Relays)
	assert.NotNil(t, st.Outbox.OldestMS)
	require.Len(t, st.Outbox.SetAsideRows, 1)
	assert.Equal(t, "orders", st.Outbox.SetAsideRows[0].Topic)
	assert.Contains(t, st.Outbox.SetAsideRows[0].Reason, "NOT_FOUND")
	assert.Empty(t, st.Outbox.Error)
	require.Len(t, st.Queues, 1)

	// Replayed, the row is no longer a problem.
	run(t, env.URL, append([]string{"outbox", "replay"}, pg...)...)
	out = run(t, env.URL, append(args, pg...)...)
	assert.NotContains(t, out, "  outbox "+schema+": 1 row set aside")
	assert.Contains(t, out, "  outbox "+schema+": 3 rows waiting and no relay connected\n")
	assert.Contains(t, out, "; 0 rows set aside\n")

	// Without --postgres (and $WARREN_POSTGRES_URL, which TestMain unsets): no outbox.
	out = run(t, env.URL, args...)
	assert.NotContains(t, out, "outbox "+schema)
	assert.NotContains(t, out, "relays:")
	assert.NotContains(t, run(t, env.URL, append(args, "--json")...), `"outbox"`)
}

// A database that cannot be reached is said in the outbox's section, the rest of status
// shown, and status exits 1, as when it cannot read the broker; so with --json.
func TestStatusOutboxUnreachable(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("outbox-down")
	delay := cliDelay(env)
	args := []string{"status", q, "--prefix", delay.Prefix, "--levels", fmt.Sprint(delay.Levels),
		"--postgres", "postgres://postgres:secret@127.0.0.1:1/postgres?sslmode=disable"}

	stdout, stderr, code := runCode(t, env.URL, args...)
	t.Logf("\n%s\n%s", stdout, stderr)
	assert.Equal(t, 1, code)
	assert.Contains(t, stdout, "  outbox warren: cannot read PostgreSQL\n", "a problem")
	assert.Contains(t, stdout, "\noutbox warren: cannot read PostgreSQL: connect: ")
	assert.Regexp(t, regexp.MustCompile(`\n`+regexp.QuoteMeta(q)+`\s+0\s+0\s+-\s+0\n`), stdout, "the rest is shown")
	assert.Contains(t, stderr, "outbox warren: cannot read PostgreSQL: connect: ")
	assert.NotContains(t, stdout+stderr, "secret")

	stdout, _, code = runCode(t, env.URL, append(args, "--json")...)
	assert.Equal(t, 1, code)
	var st struct {
		Outbox map[string]any `json:"outbox"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &st))
	assert.Equal(t, "warren", st.Outbox["schema"])
	assert.Contains(t, st.Outbox["error"], "cannot read PostgreSQL: connect: ")
	assert.NotContains(t, st.Outbox, "waiting", "no figure when none was read")

	// A URL that does not parse is refused first, as a bad flag.
	_, stderr, code = runCode(t, env.URL, "status", q, "--postgres", "postgres://x:y@[::1/")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "--postgres: ")
}

// A database that accepts the connection and never answers holds status no longer than
// its --timeout.
func TestReadOutboxWithinTheTimeout(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var held sync.WaitGroup
	defer held.Wait()
	defer ln.Close()
	held.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held.Go(func() { // read whatever comes, answer nothing
				_, _ = io.Copy(io.Discard, c)
				_ = c.Close()
			})
		}
	})
	cfg, err := pgx.ParseConfig("postgres://postgres@" + ln.Addr().String() + "/postgres?sslmode=disable")
	require.NoError(t, err)
	box := readOutbox(t.Context(), cfg, "", 200*time.Millisecond)
	require.Error(t, box.err)
	assert.Equal(t, "warren", box.schema)
	assert.Equal(t, []ops.Problem{{Kind: problemOutbox, Text: "outbox warren: cannot read PostgreSQL"}}, box.problems())
}
