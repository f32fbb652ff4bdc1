//go:build faults

package faults

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/outbox"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// The outbox cases: transactions that write an order and publish its event through the
// outbox (one in ten rolled back), relay processes, and consumer processes that write one
// effect per event in the inbox's transaction, while a fault happens.
const (
	outboxTransactions = 10000
	outboxRate         = 700 // transactions a second
	outboxWriters      = 16
	outboxSettle       = 2 * time.Minute
)

// Environment of the outbox cases' child processes (besides childURL, childQueue and
// childDelayName).
const (
	childPostgres = "FAULTS_POSTGRES"
	childSchema   = "FAULTS_SCHEMA"
)

func init() {
	children["outbox-relay"] = outboxRelayMain
	children["outbox-consumer"] = outboxConsumerMain
}

// childContext ends on SIGTERM, or when the test process is gone.
func childContext() (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	go func() {
		for parent := os.Getppid(); os.Getppid() == parent; {
			time.Sleep(time.Second)
		}
		stop()
	}()
	return ctx, stop
}

// outboxRelayMain runs a relay of $FAULTS_SCHEMA's outbox into the node until SIGTERM.
func outboxRelayMain() int {
	ctx, stop := childContext()
	defer stop()
	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	pool, err := pgxpool.New(ctx, os.Getenv(childPostgres))
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return 1
	}
	defer pool.Close()
	pub, err := dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: os.Getenv(childURL)},
		Topology: topology.Config{Delay: topology.Delay{Prefix: os.Getenv(childDelayName)}}}, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return 1
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: pub, Schema: os.Getenv(childSchema)}, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return 1
	}
	fmt.Println("ready")
	if err := relay.Run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "relay: Run:", err)
		return 1
	}
	return 0
}

// outboxConsumerMain runs a router whose handler writes one effect per event in the inbox's
// transaction, until SIGTERM.
func outboxConsumerMain() int {
	ctx, stop := childContext()
	defer stop()
	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	pool, err := pgxpool.New(ctx, os.Getenv(childPostgres))
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 1
	}
	defer pool.Close()
	schema := os.Getenv(childSchema)
	in, err := outbox.NewInbox(outbox.InboxConfig{Pool: pool, Schema: schema}, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 1
	}
	defer in.Close()
	r, err := router.New(router.Config{
		Connection: warren.Connection{URL: os.Getenv(childURL)},
		Topology:   topology.Config{Delay: topology.Delay{Prefix: os.Getenv(childDelayName)}},
		Retry:      middleware.BackoffConfig{Delays: retryDelays},
	}, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 1
	}
	effects := pgx.Identifier{schema, "effects"}.Sanitize()
	// Each delivery that reaches the inbox, which the test counts against the effects: the
	// copies and redeliveries the inbox acked without running the handler.
	var mu sync.Mutex
	count := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			mu.Lock()
			fmt.Println("delivery", msg.UUID)
			mu.Unlock()
			return h(msg)
		}
	}
	err = r.AddConsumerHandler(router.HandlerConfig{Queue: os.Getenv(childQueue), Middleware: []message.HandlerMiddleware{count, in.Middleware}},
		func(msg *message.Message) error {
			tx, _ := outbox.TxFrom(msg.Context())
			if _, err := tx.Exec(msg.Context(), "INSERT INTO "+effects+" (event) VALUES ($1)", msg.UUID); err != nil {
				return err
			}
			time.Sleep(2 * time.Millisecond) // inside the transaction: a kill finds some open
			return nil
		})
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 1
	}
	go func() {
		<-r.Running()
		fmt.Println("ready")
	}()
	if err := r.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "consumer: Run:", err)
		return 1
	}
	return 0
}

// outboxCase is one outbox case: a node, the database schema, the child processes.
type outboxCase struct {
	t      *testing.T
	name   string
	node   *testenv.Node
	pgURL  string // the database's, for the children
	pool   *pgxpool.Pool
	schema string
	queue  string
	delay  string
	logDir string
	start  time.Time
	// retry makes a writer run a transaction that failed again, with a new one, until it
	// ends as meant (committed, or rolled back when i%10 == 3) or Patience has passed since
	// its first try: for a case whose database goes down. Without it a failure is final.
	retry bool

	written    atomic.Int64 // transactions done (committed or rolled back)
	deliveries atomic.Int64 // deliveries that reached a consumer's inbox
	failed     atomic.Int64 // transactions that failed (with retry: failed still after Patience)
	retried    atomic.Int64 // tries of a transaction that failed and were run again (retry)
	// committedAnyway counts transactions whose try returned an error although it had
	// committed: the next try found its order (retry).
	committedAnyway atomic.Int64

	errMu  sync.Mutex
	errors map[string]int // the errors of the tries run again, by message (addresses as ADDR)
}

// child is a running child process of an outbox case.
type child struct {
	*proc
	name string
}

// newOutboxCase prepares a case on the shared PostgreSQL (a schema of its own).
func newOutboxCase(t *testing.T, name string) *outboxCase {
	return newOutboxCaseAt(t, name, testenv.PostgresURL())
}

// newOutboxCaseAt prepares a case on the PostgreSQL at pgURL (a schema of its own): a node,
// the outbox's tables, the orders and effects tables.
func newOutboxCaseAt(t *testing.T, name, pgURL string) *outboxCase {
	c := &outboxCase{t: t, name: name, queue: "faults." + name, delay: "faults." + name + ".delay", start: time.Now(),
		pgURL: pgURL, errors: map[string]int{}}
	c.node = testenv.StartNode(t)
	c.pool, c.schema = testenv.PostgresAt(t, pgURL)
	c.logDir = t.TempDir()
	if dir := os.Getenv("FAULTS_LOGDIR"); dir != "" {
		c.logDir = filepath.Join(dir, name)
		if err := os.MkdirAll(c.logDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	if err := outbox.Migrate(ctx, c.pool, c.schema); err != nil {
		t.Fatal(err)
	}
	if _, err := c.pool.Exec(ctx, "CREATE TABLE "+c.table("orders")+" (event text PRIMARY KEY); "+
		"CREATE TABLE "+c.table("effects")+" (event text NOT NULL)", pgx.QueryExecModeSimpleProtocol); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *outboxCase) table(name string) string { return pgx.Identifier{c.schema, name}.Sanitize() }

// spawn starts the test binary as a child of kind, and waits until it says it is ready.
func (c *outboxCase) spawn(kind, name string) *child {
	c.t.Helper()
	ready := make(chan struct{})
	ch := &child{name: name}
	ch.proc = startProc(c.t, []string{childEnv + "=" + kind, childURL + "=" + c.node.URL(), childQueue + "=" + c.queue,
		childDelayName + "=" + c.delay, childPostgres + "=" + c.pgURL, childSchema + "=" + c.schema},
		filepath.Join(c.logDir, name+".log"), func(line string) {
			switch {
			case line == "ready":
				close(ready)
			case strings.HasPrefix(line, "delivery "):
				c.deliveries.Add(1)
			}
		})
	ch.awaitReady(c.t, name, ready)
	return ch
}

func (ch *child) kill9() {
	_ = ch.cmd.Process.Kill()
	<-ch.done
}

func (ch *child) stop() {
	_ = ch.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-ch.done:
	case <-time.After(testenv.Patience()):
		_ = ch.cmd.Process.Kill()
		<-ch.done
	}
}

// write runs the transactions in the background at outboxRate: each writes an order and
// publishes its event through the outbox; one in ten rolls back. The returned channel is
// closed when all are done.
func (c *outboxCase) write() <-chan struct{} {
	box, err := outbox.New(outbox.Config{Schema: c.schema}, nil)
	if err != nil {
		c.t.Fatal(err)
	}
	done := make(chan struct{})
	var next atomic.Int64
	var wg sync.WaitGroup
	begin := time.Now()
	for range outboxWriters {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= outboxTransactions {
					return
				}
				time.Sleep(time.Until(begin.Add(time.Duration(i) * time.Second / outboxRate)))
				c.run(box, i)
				c.written.Add(1)
			}
		})
	}
	go func() {
		wg.Wait()
		close(done)
	}()
	return done
}

// run runs transaction i, and with c.retry runs it again, as a new transaction, after a
// failure. "Committed" is what the database holds, whatever a try returned: a try whose
// COMMIT failed may have committed, and then the next try's insert of the order fails as a
// duplicate, which ends the transaction as committed (c.committedAnyway), so that nothing
// commits twice and no try is counted as a commit it was not.
func (c *outboxCase) run(box *outbox.Outbox, i int) {
	first := time.Now()
	for try := 1; ; try++ {
		err := c.transaction(box, i)
		switch {
		case err == nil:
			return
		case !c.retry:
			c.failed.Add(1)
			c.t.Logf("transaction %d: %v", i, err)
			return
		case try > 1 && isUniqueViolation(err):
			c.committedAnyway.Add(1)
			return
		case time.Since(first) > testenv.Patience():
			c.failed.Add(1)
			c.t.Logf("transaction %d: still failing after %s: %v", i, testenv.Patience(), err)
			return
		}
		c.retried.Add(1)
		c.errMu.Lock()
		c.errors[hostPorts.ReplaceAllString(err.Error(), "ADDR")]++
		c.errMu.Unlock()
		time.Sleep(100 * time.Millisecond)
	}
}

// hostPorts matches the addresses in an error, so that the errors of tries group by kind.
var hostPorts = regexp.MustCompile(`\d+\.\d+\.\d+\.\d+:\d+`)

// isUniqueViolation tells whether err is PostgreSQL's unique_violation.
func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// transaction i: an order and its event, committed unless i%10 == 3.
func (c *outboxCase) transaction(box *outbox.Outbox, i int) error {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience())
	defer cancel()
	id := fmt.Sprintf("e%05d", i)
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit: nothing to undo
	if _, err := tx.Exec(ctx, "INSERT INTO "+c.table("orders")+" (event) VALUES ($1)", id); err != nil {
		return err
	}
	if err := box.Publish(ctx, tx, c.queue, message.NewMessage(id, []byte(id))); err != nil {
		return err
	}
	if i%10 == 3 {
		return tx.Rollback(ctx)
	}
	return tx.Commit(ctx)
}

// awaitWritten waits until k transactions are done.
func (c *outboxCase) awaitWritten(k int) {
	c.t.Helper()
	for deadline := time.Now().Add(3 * time.Minute); c.written.Load() < int64(k); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			c.t.Fatalf("%d transactions after 3 minutes, waiting for %d", c.written.Load(), k)
		}
	}
}

// counts reads the case's figures from the database: committed orders, effects, orders
// without an effect (lost), effects of no committed order (phantom), orders with more than
// one effect (twice).
func (c *outboxCase) counts() (committed, effects, lost, phantom, twice int) {
	c.t.Helper()
	o, e := c.table("orders"), c.table("effects")
	c.query(func(ctx context.Context) error {
		return c.pool.QueryRow(ctx, "SELECT "+
			"(SELECT count(*) FROM "+o+"), (SELECT count(*) FROM "+e+"), "+
			"(SELECT count(*) FROM "+o+" WHERE event NOT IN (SELECT event FROM "+e+")), "+
			"(SELECT count(*) FROM "+e+" WHERE event NOT IN (SELECT event FROM "+o+")), "+
			"(SELECT count(*) FROM (SELECT event FROM "+e+" GROUP BY event HAVING count(*) > 1) t)").
			Scan(&committed, &effects, &lost, &phantom, &twice)
	})
	return committed, effects, lost, phantom, twice
}

// query runs q, again after a failure (a connection of the pool that a restart of the
// database broke) until it succeeds or Patience has passed; it fails the test then.
func (c *outboxCase) query(q func(context.Context) error) {
	c.t.Helper()
	deadline := time.Now().Add(testenv.Patience())
	for {
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience())
		err := q(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// finish waits until every committed order has its effect (at most outboxSettle), then 3 s
// more for copies, stops the children, prints the case's line and fails on any order lost,
// phantom or twice.
func (c *outboxCase) finish(written <-chan struct{}, children ...*child) {
	t := c.t
	select {
	case <-written:
	case <-time.After(3 * time.Minute):
		t.Fatal("the transactions did not end within 3 minutes")
	}
	deadline := time.Now().Add(outboxSettle)
	for {
		committed, effects, lost, _, _ := c.counts()
		if lost == 0 && effects >= committed {
			break
		}
		if time.Now().After(deadline) {
			t.Logf("not settled after %s: %d committed, %d effects, %d without one", outboxSettle, committed, effects, lost)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // copies still on their way would land now
	for _, ch := range children {
		ch.stop()
	}
	committed, effects, lost, phantom, twice := c.counts()
	var st outbox.Stats
	c.query(func(ctx context.Context) (err error) {
		st, err = outbox.ReadStats(ctx, c.pool, c.schema)
		return err
	})
	line := fmt.Sprintf("faults case=%s transactions=%d committed=%d rolled_back=%d failed=%d effects=%d lost=%d phantom=%d twice=%d "+
		"deliveries=%d not_run_again=%d outbox_waiting=%d set_aside=%d secs=%.0f",
		c.name, outboxTransactions, committed, outboxTransactions/10, c.failed.Load(), effects, lost, phantom, twice,
		c.deliveries.Load(), c.deliveries.Load()-int64(effects), st.Waiting, st.SetAside, time.Since(c.start).Seconds())
	if c.retry {
		line += fmt.Sprintf(" retried=%d committed_anyway=%d poisoned=%d", c.retried.Load(), c.committedAnyway.Load(), c.poisoned())
		c.errMu.Lock()
		msgs := slices.SortedFunc(maps.Keys(c.errors), func(a, b string) int { return c.errors[b] - c.errors[a] })
		for _, msg := range msgs {
			t.Logf("%d tries failed and ran again with: %s", c.errors[msg], msg)
		}
		c.errMu.Unlock()
	}
	fmt.Println(line)
	t.Log(line)
	if committed < outboxTransactions*8/10 || c.failed.Load() > 0 {
		t.Errorf("%d transactions committed, %d failed: the case proves little", committed, c.failed.Load())
	}
	if lost != 0 || phantom != 0 || twice != 0 {
		t.Errorf("%d lost, %d phantom, %d twice", lost, phantom, twice)
	}
	if t.Failed() {
		for _, ch := range children {
			t.Logf("%s:\n%s", ch.name, tail(filepath.Join(c.logDir, ch.name+".log"), 30))
		}
	}
}

// poisoned returns how many messages the case's poison queue holds.
func (c *outboxCase) poisoned() int {
	c.t.Helper()
	return testenv.NewAt(c.t, c.node.URL()).Messages(topology.PoisonQueue(c.queue))
}

// (e) The relay holding the outbox is killed with SIGKILL while events flow, 5 times: each
// time the one on standby takes over and a new standby starts.
func TestOutboxRelayKill9(t *testing.T) {
	const kills = 5
	c := newOutboxCase(t, "outbox_relay_kill9")
	consumers := []*child{c.spawn("outbox-consumer", "consumer1"), c.spawn("outbox-consumer", "consumer2")}
	leader := c.spawn("outbox-relay", "relay1")
	written := c.write()
	c.awaitWritten(outboxTransactions / 20)
	standby := c.spawn("outbox-relay", "relay2") // relay1 holds the lock by now
	for k := 1; k <= kills; k++ {
		c.awaitWritten(outboxTransactions * (k + 1) / (kills + 3))
		leader.kill9()
		t.Logf("%.3fs: %s killed", time.Since(c.start).Seconds(), leader.name)
		leader, standby = standby, c.spawn("outbox-relay", fmt.Sprintf("relay%d", k+2))
	}
	c.finish(written, append(consumers, leader, standby)...)
}

// (f) A consumer process is killed with SIGKILL while its handlers' transactions are open; a
// replacement starts.
func TestOutboxConsumerKill9(t *testing.T) {
	c := newOutboxCase(t, "outbox_consumer_kill9")
	victim := c.spawn("outbox-consumer", "consumer1")
	other := c.spawn("outbox-consumer", "consumer2")
	relay := c.spawn("outbox-relay", "relay1")
	written := c.write()
	c.awaitWritten(outboxTransactions * 4 / 10)
	victim.kill9()
	t.Logf("%.3fs: consumer1 killed", time.Since(c.start).Seconds())
	replacement := c.spawn("outbox-consumer", "consumer3")
	c.finish(written, other, replacement, relay)
}

// (g) The broker is killed with SIGKILL and restarted while events flow.
func TestOutboxBrokerKill9(t *testing.T) {
	c := newOutboxCase(t, "outbox_broker_kill9")
	consumers := []*child{c.spawn("outbox-consumer", "consumer1"), c.spawn("outbox-consumer", "consumer2")}
	relay := c.spawn("outbox-relay", "relay1")
	written := c.write()
	c.awaitWritten(outboxTransactions * 4 / 10)
	c.node.Crash()
	t.Logf("%.3fs: broker killed and booted again", time.Since(c.start).Seconds())
	c.finish(written, append(consumers, relay)...)
}

// (h) PostgreSQL is stopped and started again while the writers, relays and consumers run:
// once with a fast shutdown (open transactions rolled back, connections closed, a
// checkpoint) and once with an immediate one (every server process quits at once, no
// checkpoint; the start replays the write-ahead log: PostgreSQL's kill -9), each time down
// for pgDown. The server is one of the case's own (testenv.StartPostgres), never the shared
// one.
//
// The writers run a transaction that failed again, as a new one, until it ends as meant
// (outboxCase.retry): a failure while the database is down is the application's to retry,
// and the case counts those tries (retried) apart from transactions that never got through
// (failed, which still fails the case). The consumers keep the suite's short retry schedule
// (350 ms in all): the inbox waits out a database it cannot reach for up to its Timeout
// (10 s) when it begins a transaction, so a message that comes during the outage is handled
// after it, not poisoned; the few transactions open when the server stops fail and are
// retried.
func TestOutboxPostgresRestart(t *testing.T) {
	const pgDown = 2 * time.Second
	pg := testenv.StartPostgres(t)
	c := newOutboxCaseAt(t, "outbox_postgres_restart", pg.URL())
	c.retry = true
	consumers := []*child{c.spawn("outbox-consumer", "consumer1"), c.spawn("outbox-consumer", "consumer2")}
	relays := []*child{c.spawn("outbox-relay", "relay1")}
	written := c.write()
	c.awaitWritten(outboxTransactions / 20)
	relays = append(relays, c.spawn("outbox-relay", "relay2")) // on standby: relay1 holds the lock by now
	for k, mode := range []testenv.PGStopMode{testenv.PGFast, testenv.PGImmediate} {
		c.awaitWritten(outboxTransactions * (k + 1) * 3 / 10)
		pg.Stop(mode)
		t.Logf("%.3fs: PostgreSQL stopped (%s) after %d transactions", time.Since(c.start).Seconds(), mode, c.written.Load())
		time.Sleep(pgDown)
		pg.Start()
		t.Logf("%.3fs: PostgreSQL started again", time.Since(c.start).Seconds())
	}
	c.finish(written, append(consumers, relays...)...)
}
