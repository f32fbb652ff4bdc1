package redisstore_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/middleware/redisstore"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// The multi-process tests start the test binary again as consumer processes (see
// consumerMain), which share one Redis store.
const (
	childEnv   = "WARREN_TEST_CHILD"
	childValue = "idempotent-consumer"
	envURL     = "IDEM_URL"
	envQueue   = "IDEM_QUEUE"
	envPrefix  = "IDEM_REDIS_PREFIX" // of the shared store's keys
	envLease   = "IDEM_LEASE"        // the store's lease; "" for the default
	envWork    = "IDEM_WORK"         // how long a handler call works
	envHold    = "IDEM_HOLD"         // a message id whose handler call never returns (until shutdown)
	copyKey    = "idem_copy"         // metadata: which copy of a message this is ("a" or "b")
)

// consumerMain runs a warren router with one handler on $IDEM_QUEUE until SIGTERM. The
// handler is guarded by middleware.Idempotent keyed by middleware.MessageIDKey, with a
// redisstore.Store under $IDEM_REDIS_PREFIX, in HandlerConfig.Middleware (around the
// handler: processed means succeeded). It writes to stdout "ready" once consuming; "call
// <id> <copy>" when the handler is called; "hold <id>" when that call holds on; and, for
// every delivery that reaches the guard, "delivery <id> <copy> <start ns> <end ns>
// <outcome>" (outcome: processed, skipped as processed already, busy as held by another
// holder, or failed). Logs go to stderr.
func consumerMain() int {
	var mu sync.Mutex
	line := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...) // one write per line: nothing is lost to SIGKILL
	}
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 1
	}
	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	var lease, work time.Duration
	if v := os.Getenv(envLease); v != "" {
		var err error
		if lease, err = time.ParseDuration(v); err != nil {
			return fail(err)
		}
	}
	if v := os.Getenv(envWork); v != "" {
		var err error
		if work, err = time.ParseDuration(v); err != nil {
			return fail(err)
		}
	}
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer rdb.Close()
	store, err := redisstore.New(redisstore.Config{Client: rdb, Prefix: os.Getenv(envPrefix), Lease: lease}, logger)
	if err != nil {
		return fail(err)
	}
	defer store.Close()
	once, err := middleware.NewIdempotent(middleware.IdempotentConfig{Store: store, Key: middleware.MessageIDKey}, logger)
	if err != nil {
		return fail(err)
	}
	r, err := router.New(router.Config{
		Connection:   warren.Connection{URL: os.Getenv(envURL)},
		Topology:     topology.Config{Delay: topology.Delay{Disabled: true}}, // the handler never fails: no retries
		RequeueDelay: 50 * time.Millisecond,
	}, logger)
	if err != nil {
		return fail(err)
	}
	type calledKey struct{}
	record := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			called := new(bool)
			msg.SetContext(context.WithValue(msg.Context(), calledKey{}, called))
			start := time.Now()
			out, err := h(msg)
			end := time.Now()
			var rq *middleware.RequeueError
			outcome := "processed"
			switch {
			case errors.As(err, &rq):
				outcome = "busy"
			case err != nil:
				outcome = "failed"
			case !*called:
				outcome = "skipped"
			}
			line("delivery %s %s %d %d %s", msg.UUID, msg.Metadata.Get(copyKey), start.UnixNano(), end.UnixNano(), outcome)
			return out, err
		}
	}
	hold := os.Getenv(envHold)
	err = r.AddConsumerHandler(router.HandlerConfig{
		Queue:      os.Getenv(envQueue),
		Middleware: []message.HandlerMiddleware{record, once.Middleware},
	}, func(msg *message.Message) error {
		*msg.Context().Value(calledKey{}).(*bool) = true
		line("call %s %s", msg.UUID, msg.Metadata.Get(copyKey))
		if msg.UUID == hold {
			line("hold %s", msg.UUID)
			<-msg.Context().Done() // until killed, or shut down
			return msg.Context().Err()
		}
		time.Sleep(work) // simulates work: the twin arrives meanwhile
		return nil
	})
	if err != nil {
		return fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	go func() { // a test that ended without stopping it (timed out) leaves no orphan behind
		for parent := os.Getppid(); os.Getppid() == parent; {
			time.Sleep(time.Second)
		}
		fmt.Fprintln(os.Stderr, "consumer: the test process is gone")
		os.Exit(3)
	}()
	go func() {
		<-r.Running()
		line("ready")
	}()
	if err := r.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fail(fmt.Errorf("run: %w", err))
	}
	return 0
}

// delivery is one delivery that reached a consumer's guard.
type delivery struct {
	proc, id, copy, outcome string
	start, end              time.Time
}

// ledger is what the consumer processes wrote.
type ledger struct {
	mu         sync.Mutex
	calls      map[string][]string // id → the process of each handler call
	holds      map[string]string   // id → the process that holds its call
	deliveries []delivery
	changed    chan struct{} // a token whenever a line was read
}

func newLedger() *ledger {
	return &ledger{calls: map[string][]string{}, holds: map[string]string{}, changed: make(chan struct{}, 1)}
}

func (l *ledger) read(t *testing.T, proc, text string) {
	f := strings.Fields(text)
	l.mu.Lock()
	defer l.mu.Unlock()
	defer func() {
		select {
		case l.changed <- struct{}{}:
		default:
		}
	}()
	switch {
	case len(f) == 3 && f[0] == "call":
		l.calls[f[1]] = append(l.calls[f[1]], proc)
	case len(f) == 2 && f[0] == "hold":
		l.holds[f[1]] = proc
	case len(f) == 6 && f[0] == "delivery":
		start, err1 := strconv.ParseInt(f[3], 10, 64)
		end, err2 := strconv.ParseInt(f[4], 10, 64)
		if err1 != nil || err2 != nil {
			t.Errorf("%s: bad line %q", proc, text)
			return
		}
		l.deliveries = append(l.deliveries, delivery{proc: proc, id: f[1], copy: f[2], outcome: f[5],
			start: time.Unix(0, start), end: time.Unix(0, end)})
	default:
		t.Errorf("%s: unexpected line %q", proc, text)
	}
}

// await waits until cond (called with l locked) holds, or fails t after limit.
func (l *ledger) await(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		ok := cond()
		l.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-l.changed:
		case <-deadline.C:
			t.Fatalf("not within %s: %s", limit, what)
		}
	}
}

// child is a consumer process.
type child struct {
	name  string
	cmd   *exec.Cmd
	log   string
	ready chan struct{}
	done  chan struct{} // closed once its stdout is read to the end
}

// startChild starts a consumer process with the given IDEM_* environment and waits until it
// consumes. It is killed when t ends, if still running.
func startChild(t *testing.T, l *ledger, name string, env map[string]string) *child {
	t.Helper()
	c := &child{name: name, ready: make(chan struct{}), done: make(chan struct{})}
	c.log = filepath.Join(t.TempDir(), name+".log")
	stderr, err := os.Create(c.log)
	require.NoError(t, err)
	defer stderr.Close()
	exe, err := os.Executable()
	require.NoError(t, err)
	c.cmd = exec.Command(exe, "-test.run=^$")
	c.cmd.Env = append(os.Environ(), childEnv+"="+childValue)
	for k, v := range env {
		c.cmd.Env = append(c.cmd.Env, k+"="+v)
	}
	c.cmd.Stderr = stderr
	stdout, err := c.cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, c.cmd.Start())
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			_ = c.cmd.Process.Kill()
			<-c.done
			_ = c.cmd.Wait()
		}
		if t.Failed() {
			b, _ := os.ReadFile(c.log)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("%s's log (tail):\n%s", name, b)
		}
	})
	go func() {
		defer close(c.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "ready" {
				close(c.ready)
				continue
			}
			l.read(t, name, sc.Text())
		}
	}()
	select {
	case <-c.ready:
	case <-c.done:
		t.Fatalf("%s exited before it consumed", name)
	case <-time.After(testenv.Patience()):
		t.Fatalf("%s does not consume after 60s", name)
	}
	return c
}

// stop stops c with SIGTERM and waits until it has exited, gracefully.
func (c *child) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGTERM))
	<-c.done
	require.NoError(t, c.cmd.Wait(), "%s did not stop cleanly", c.name)
}

// kill kills c with SIGKILL, as a crash would, and waits until it is gone.
func (c *child) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, c.cmd.Process.Kill())
	<-c.done
	_ = c.cmd.Wait()
}

// idemSetup is what a multi-process test shares with its consumers.
type idemSetup struct {
	env    *testenv.Env
	queue  string
	prefix string
	rdb    *redis.Client
	pub    *dlx.Publisher
}

func newIdemSetup(t *testing.T) idemSetup {
	t.Helper()
	env := testenv.New(t)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	s := idemSetup{env: env, queue: env.Queue("idem"), prefix: "warren:test:" + t.Name() + ":" + hex.EncodeToString(b) + ":"}
	s.rdb = testenv.Redis(t, s.prefix)
	pub, err := dlx.NewPublisher(dlx.Config{Connection: env.Connection(), Topology: topology.Config{Delay: topology.Delay{Disabled: true}}}, env.Logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = pub.Close() })
	s.pub = pub
	return s
}

func (s idemSetup) childEnv(extra map[string]string) map[string]string {
	m := map[string]string{envURL: s.env.URL, envQueue: s.queue, envPrefix: s.prefix}
	for k, v := range extra {
		m[k] = v
	}
	return m
}

// publish publishes each of msgs in a Publish call of its own, from workers goroutines at
// once, in order: neighbours are published at the same time.
func (s idemSetup) publish(t *testing.T, msgs []*message.Message, workers int) {
	t.Helper()
	jobs := make(chan *message.Message)
	errs := make(chan error, len(msgs))
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for m := range jobs {
				if err := s.pub.Publish(s.queue, m); err != nil {
					errs <- err
				}
			}
		})
	}
	for _, m := range msgs {
		jobs <- m
	}
	close(jobs)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// Every one of 1,000 messages is delivered twice, to 3 consumer processes at once that share a
// redisstore.Store, and is processed once: middleware.Idempotent keyed by MessageIDKey, around
// the handler. The twins are two publishes of one message id (what a producer that sends
// again makes: two publish ids, which warren's subscriber does not take for copies), or two
// copies of one publish (one publish id, as a re-send after a lost confirm makes them). The
// test records which process got each copy, and when, so that it shows the contention it
// relies on rather than assuming it.
func TestThreeProcessesProcessEachOfTwiceDeliveredMessagesOnce(t *testing.T) {
	for _, tc := range []struct {
		name        string
		onePublish  bool // both copies carry one publish id
		wantAllSeen bool // every delivery reaches a guard (the subscriber acks some copies of one publish itself)
	}{
		{name: "two_publishes_of_one_id", wantAllSeen: true},
		{name: "copies_of_one_publish", onePublish: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const (
				messages  = 1000
				processes = 3
			)
			s := newIdemSetup(t)
			l := newLedger()
			var children []*child
			for i := range processes {
				children = append(children, startChild(t, l, fmt.Sprintf("p%d", i+1), s.childEnv(map[string]string{envWork: "20ms"})))
			}

			var msgs []*message.Message
			for i := range messages {
				id := fmt.Sprintf("m%04d", i)
				for _, c := range []string{"a", "b"} {
					m := message.NewMessage(id, []byte(id))
					m.Metadata.Set(copyKey, c)
					if tc.onePublish {
						m.Metadata.Set(warren.MetadataPublishID, "pub-"+id)
					}
					msgs = append(msgs, m)
				}
			}
			s.publish(t, msgs, 32)

			l.await(t, 2*testenv.Patience(), "every message processed", func() bool { return len(l.calls) == messages })
			if tc.wantAllSeen {
				l.await(t, 2*testenv.Patience(), "all 2,000 deliveries acked", func() bool {
					acked := 0
					for _, d := range l.deliveries {
						if d.outcome == "processed" || d.outcome == "skipped" {
							acked++
						}
					}
					return acked == 2*messages
				})
			}
			for _, c := range children {
				c.stop(t) // what is unacked goes back to the queue
			}

			q, err := s.env.Inspect(s.queue)
			require.NoError(t, err)
			assert.Zero(t, q.Messages, "every delivery settled: the queue is empty once the consumers are gone")
			p, err := s.env.Inspect(topology.PoisonQueue(s.queue))
			require.NoError(t, err)
			assert.Zero(t, p.Messages, "nothing poisoned")

			l.mu.Lock()
			defer l.mu.Unlock()
			twice := 0
			for id, procs := range l.calls {
				if len(procs) != 1 {
					twice++
					if twice <= 10 {
						t.Errorf("message %s processed %d times, by %v", id, len(procs), procs)
					}
				}
			}
			assert.Len(t, l.calls, messages, "every message processed")
			assert.Zero(t, twice, "messages processed more than once")

			outcomes := map[string]int{}
			for _, d := range l.deliveries {
				outcomes[d.outcome]++
			}
			assert.Zero(t, outcomes["failed"], "failed deliveries")
			if tc.wantAllSeen {
				assert.Equal(t, messages, outcomes["processed"])
				assert.Equal(t, messages, outcomes["skipped"], "the other copy of each is acked as processed already")
			}

			// The evidence of contention: per message, the first delivery of each copy, and
			// which process it reached when.
			first := map[string]map[string]delivery{} // id → copy → first delivery
			sort.Slice(l.deliveries, func(i, j int) bool { return l.deliveries[i].start.Before(l.deliveries[j].start) })
			processed := map[string]delivery{}
			for _, d := range l.deliveries {
				if first[d.id] == nil {
					first[d.id] = map[string]delivery{}
				}
				if _, ok := first[d.id][d.copy]; !ok {
					first[d.id][d.copy] = d
				}
				if d.outcome == "processed" {
					processed[d.id] = d
				}
			}
			// ids a process found held by another: a copy that reached its guard while
			// another process was processing the message, waited, and was acked unhandled.
			heldElsewhere := map[string]bool{}
			for _, d := range l.deliveries {
				p, ok := processed[d.id]
				if ok && d.outcome == "skipped" && d.proc != p.proc && d.start.Before(p.end) {
					heldElsewhere[d.id] = true
				}
			}
			apart, atOnce := 0, 0
			for _, c := range first {
				a, okA := c["a"]
				b, okB := c["b"]
				if !okA || !okB || a.proc == b.proc {
					continue
				}
				apart++
				if !a.start.After(b.end) && !b.start.After(a.end) { // their guards ran at the same time
					atOnce++
				}
			}
			t.Logf("%d messages: both copies reached the guards of different processes for %d, at the same time (overlapping) for %d; "+
				"for %d a process found the message held by another (it waited, then acked its copy unhandled); deliveries by outcome %v",
				messages, apart, atOnce, len(heldElsewhere), outcomes)
			assert.GreaterOrEqual(t, atOnce, messages/10, "too little contention to prove anything: the copies of most messages did not meet")
			assert.GreaterOrEqual(t, len(heldElsewhere), messages/10, "too few messages found held by another process")
		})
	}
}

// A consumer process killed (SIGKILL) while it processes a message holds the message's key in
// Redis, and nothing renews it any more: the broker delivers the message again, to another
// process, which finds it held and requeues it until the lease ends, and then processes it.
// The crash does not block the message for ever, nor lose it.
//
// Not parallel: the other processes must see the dead holder's claim within its lease.
func TestAClaimOfAProcessKilledWhileProcessingEndsWithItsLease(t *testing.T) {
	const lease = 3 * time.Second
	s := newIdemSetup(t)
	l := newLedger()
	const id = "crash-1"
	holder := startChild(t, l, "holder", s.childEnv(map[string]string{envLease: lease.String(), envHold: id}))
	msg := message.NewMessage(id, []byte(id))
	msg.Metadata.Set(copyKey, "a")
	s.publish(t, []*message.Message{msg}, 1)
	l.await(t, testenv.Patience(), "the holder holds the message", func() bool { return l.holds[id] == "holder" })

	holder.kill(t)
	key := s.prefix + middleware.MessageIDKey(withQueue(msg, s.queue))
	v, err := s.rdb.Get(context.Background(), key).Result()
	require.NoError(t, err, "the dead holder's claim outlives it")
	require.True(t, strings.HasPrefix(v, "h:"), "held, not processed: %q", v)

	survivors := []*child{
		startChild(t, l, "p1", s.childEnv(map[string]string{envLease: lease.String()})),
		startChild(t, l, "p2", s.childEnv(map[string]string{envLease: lease.String()})),
	}
	l.await(t, 10*lease, "processed after the dead holder's lease", func() bool { return len(l.calls[id]) == 2 })
	for _, c := range survivors {
		c.stop(t)
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	assert.Equal(t, "holder", l.calls[id][0])
	assert.NotEqual(t, "holder", l.calls[id][1], "processed by a survivor")
	for _, d := range l.deliveries {
		if d.proc != "holder" {
			t.Logf("%s: %s after waiting %s for the dead holder's claim", d.proc, d.outcome, d.end.Sub(d.start).Round(time.Millisecond))
		}
	}
	v, err = s.rdb.Get(context.Background(), key).Result()
	require.NoError(t, err)
	assert.Equal(t, "d", v, "recorded as processed")
	q, err := s.env.Inspect(s.queue)
	require.NoError(t, err)
	assert.Zero(t, q.Messages)
	p, err := s.env.Inspect(topology.PoisonQueue(s.queue))
	require.NoError(t, err)
	assert.Zero(t, p.Messages, "not poisoned: waiting for the lease spends none of the queue's delivery limit")
}

// withQueue returns a copy of msg as if it was consumed from queue.
func withQueue(msg *message.Message, queue string) *message.Message {
	m := msg.Copy()
	m.SetContext(contract.WithDelivery(context.Background(), contract.Delivery{Queue: queue}))
	return m
}
