//go:build faults

package faults

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
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
	pool   *pgxpool.Pool
	schema string
	queue  string
	delay  string
	logDir string
	start  time.Time

	written    atomic.Int64 // transactions done (committed or rolled back)
	deliveries atomic.Int64 // deliveries that reached a consumer's inbox
	failed     atomic.Int64 // transactions that failed
}

// child is a running child process of an outbox case.
type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

func newOutboxCase(t *testing.T, name string) *outboxCase {
	c := &outboxCase{t: t, name: name, queue: "faults." + name, delay: "faults." + name + ".delay", start: time.Now()}
	c.node = testenv.StartNode(t)
	c.pool, c.schema = testenv.Postgres(t)
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
	exe, err := os.Executable()
	if err != nil {
		c.t.Fatal(err)
	}
	stderr, err := os.Create(filepath.Join(c.logDir, name+".log"))
	if err != nil {
		c.t.Fatal(err)
	}
	defer stderr.Close()
	ch := &child{name: name, cmd: exec.Command(exe), done: make(chan struct{})}
	ch.cmd.Env = append(os.Environ(), childEnv+"="+kind, childURL+"="+c.node.URL(), childQueue+"="+c.queue,
		childDelayName+"="+c.delay, childPostgres+"="+testenv.PostgresURL(), childSchema+"="+c.schema)
	ch.cmd.Stderr = stderr
	stdout, err := ch.cmd.StdoutPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	if err := ch.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		defer close(ch.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			switch line := sc.Text(); {
			case line == "ready":
				close(ready)
			case strings.HasPrefix(line, "delivery "):
				c.deliveries.Add(1)
			}
		}
		_ = ch.cmd.Wait()
	}()
	c.t.Cleanup(func() {
		_ = ch.cmd.Process.Kill()
		<-ch.done
	})
	select {
	case <-ready:
	case <-ch.done:
		c.t.Fatalf("%s exited before it was ready\n%s", name, tail(filepath.Join(c.logDir, name+".log"), 20))
	case <-time.After(testenv.Patience()):
		c.t.Fatalf("%s not ready within %s\n%s", name, testenv.Patience(), tail(filepath.Join(c.logDir, name+".log"), 20))
	}
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
				if err := c.transaction(box, i); err != nil {
					c.failed.Add(1)
					c.t.Logf("transaction %d: %v", i, err)
				}
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
	err := c.pool.QueryRow(context.Background(), "SELECT "+
		"(SELECT count(*) FROM "+o+"), (SELECT count(*) FROM "+e+"), "+
		"(SELECT count(*) FROM "+o+" WHERE event NOT IN (SELECT event FROM "+e+")), "+
		"(SELECT count(*) FROM "+e+" WHERE event NOT IN (SELECT event FROM "+o+")), "+
		"(SELECT count(*) FROM (SELECT event FROM "+e+" GROUP BY event HAVING count(*) > 1) t)").
		Scan(&committed, &effects, &lost, &phantom, &twice)
	if err != nil {
		c.t.Fatal(err)
	}
	return committed, effects, lost, phantom, twice
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
	st, err := outbox.ReadStats(context.Background(), c.pool, c.schema)
	if err != nil {
		t.Fatal(err)
	}
	line := fmt.Sprintf("faults case=%s transactions=%d committed=%d rolled_back=%d failed=%d effects=%d lost=%d phantom=%d twice=%d "+
		"deliveries=%d not_run_again=%d outbox_waiting=%d set_aside=%d secs=%.0f",
		c.name, outboxTransactions, committed, outboxTransactions/10, c.failed.Load(), effects, lost, phantom, twice,
		c.deliveries.Load(), c.deliveries.Load()-int64(effects), st.Waiting, st.SetAside, time.Since(c.start).Seconds())
	fmt.Println(line)
	t.Log(line)
	if committed < outboxTransactions*8/10 || c.failed.Load() > 0 {
		t.Errorf("%d transactions committed, %d failed: the case proves little", committed, c.failed.Load())
	}
	if lost != 0 || phantom != 0 || twice != 0 {
		t.Errorf("%d lost, %d phantom, %d twice", lost, phantom, twice)
	}
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
