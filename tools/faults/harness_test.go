//go:build faults || cluster

package faults

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/middleware/redisstore"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// The stream every case publishes.
const (
	streamSize   = 5500                  // messages published, unless a case needs a longer stream
	minPublished = 5000                  // fewer confirmed publishes make a case fail as proving nothing
	streamRate   = 700                   // messages per second
	maxStream    = 99999                 // messages, however long a stream is held
	publishers   = 16                    // goroutines publishing, so that the rate holds while confirms are slow
	consumers    = 2                     // consumer processes
	handlerWork  = 10 * time.Millisecond // so that a fault finds messages in the handlers
	minDelay     = 10 * time.Millisecond
	maxDelay     = 3 * time.Second
)

// When a case is over, and when it failed.
const (
	quietFor    = 3 * time.Second  // nothing moved for this long: settled
	stallAfter  = 10 * time.Second // nothing processed for this long while messages wait: stalled
	settleLimit = 60 * time.Second // after the stream, at most
	streamLimit = 3 * time.Minute  // for publishing the stream, at most
	resumeLimit = 2 * time.Second
)

// retryDelays is the consumers' retry schedule: short, so that the suite is fast.
var retryDelays = []time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond}

// maxAttempts is what the consumers' Backoff gives a message (its default for an explicit
// schedule: one attempt more than delays).
var maxAttempts = len(retryDelays) + 1

// The fate of message i of the stream; the child decides from the id alone.
type fate int

const (
	succeeds   fate = iota
	failsOnce       // 5%: fails its first attempt, succeeds on a retry
	failsAlway      // 1%: fails every attempt and ends in the poison queue
)

func fateOf(i int) fate {
	switch {
	case i%100 == 99:
		return failsAlway
	case i%20 == 7:
		return failsOnce
	}
	return succeeds
}

// delayed tells whether message i is published with a delay (20%, among them a quarter
// of the messages that fail once).
func delayed(i int) bool { return i%5 == 2 }

func streamID(i int) string { return fmt.Sprintf("m%05d", i) }

func parseStreamID(id string) (int, bool) {
	if len(id) != 6 || id[0] != 'm' {
		return 0, false
	}
	i, err := strconv.Atoi(id[1:])
	return i, err == nil
}

// Environment of a consumer process.
const (
	childEnv       = "WARREN_TEST_CHILD"
	childValue     = "faults-consumer"
	childURL       = "FAULTS_URL"
	childQueue     = "FAULTS_QUEUE"
	childDelayName = "FAULTS_DELAY_PREFIX"
	childRedis     = "FAULTS_REDIS_PREFIX" // the keys of the routers' CopyStore
)

// children are the kinds of child process, by the value of $WARREN_TEST_CHILD: the consumer,
// and those that the files of other cases add.
var children = map[string]func() int{childValue: consumerMain}

// TestMain runs a consumer process (or another child) when the test binary is started as one.
func TestMain(m *testing.M) {
	if main := children[os.Getenv(childEnv)]; main != nil {
		os.Exit(main())
	}
	os.Exit(m.Run())
}

// consumerMain runs a warren router with the default configuration (but a short retry
// schedule, and a CopyStore in Redis shared by the consumer processes) and one handler on
// $FAULTS_QUEUE until SIGTERM. It writes "ready" once running,
// then one line per handler call, "call <id> <attempt>", and "ok <id>" when the call
// succeeds. Logs go to stderr.
func consumerMain() int {
	line := childLine()
	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	copies, closeCopies, err := childCopyStore(logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 1
	}
	defer closeCopies()
	r, err := router.New(router.Config{
		Connection: warren.Connection{URL: os.Getenv(childURL)},
		Topology:   topology.Config{Delay: topology.Delay{Prefix: os.Getenv(childDelayName)}},
		Retry:      middleware.BackoffConfig{Delays: retryDelays},
		CopyStore:  copies,
	}, logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 1
	}
	err = r.AddConsumerHandler(router.HandlerConfig{Queue: os.Getenv(childQueue)}, func(msg *message.Message) error {
		attempt := middleware.Attempt(msg)
		line("call %s %d", msg.UUID, attempt)
		time.Sleep(handlerWork)
		i, ok := parseStreamID(msg.UUID)
		switch {
		case !ok:
			return fmt.Errorf("faults: %q is not a message of the stream", msg.UUID)
		case fateOf(i) == failsAlway:
			return errors.New("faults: this message always fails")
		case fateOf(i) == failsOnce && attempt == 1:
			return errors.New("faults: this message fails its first attempt")
		}
		line("ok %s", msg.UUID)
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		return 1
	}
	return runChild(r, line)
}

// childLine returns the function a consumer process writes its lines to stdout with, one at
// a time.
func childLine() func(format string, args ...any) {
	var mu sync.Mutex
	return func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
}

// childCopyStore returns the CopyStore the consumer processes of a case share, in Redis under
// $FAULTS_REDIS_PREFIX, and the function that closes it.
func childCopyStore(logger watermill.LoggerAdapter) (*redisstore.Store, func(), error) {
	rdb := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	copies, err := redisstore.New(redisstore.Config{Client: rdb, Prefix: os.Getenv(childRedis)}, logger)
	if err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	return copies, func() { _ = copies.Close(); _ = rdb.Close() }, nil
}

// runChild runs the router of a consumer process until SIGTERM, writing "ready" once it runs,
// and returns the process's exit code. It exits at once when the test process is gone.
func runChild(r *router.Router, line func(format string, args ...any)) int {
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
		fmt.Fprintln(os.Stderr, "consumer: Run:", err)
		return 1
	}
	if ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "consumer: Run returned before SIGTERM")
		return 2
	}
	return 0
}

// harness is one case: a node, consumer processes, the stream, and the ledger of what the
// consumers did.
type harness struct {
	t       *testing.T
	name    string
	node    *testenv.Node    // the node of a single-node case
	cluster *testenv.Cluster // the cluster of a cluster case (node is nil)
	// routerURL and pubURL are the URLs the consumer processes and the stream's publisher
	// are given: the node's, or the cluster's.
	routerURL, pubURL string
	pub               *dlx.Publisher // the stream's, when made before stream (see newPublisher)
	queue             string
	delay             topology.Delay
	logDir            string
	redisPrefix       string // of the consumers' CopyStore keys
	start             time.Time
	seed              uint64
	size              int // messages in the stream

	sent        atomic.Int64  // publishes started
	held        atomic.Bool   // see hold
	streamStart time.Time     // set by stream
	streamDone  chan struct{} // closed when every publish returned
	streamEnd   time.Time     // set before streamDone is closed

	mu        sync.Mutex
	consumers []*consumer
	published map[string]bool
	pubErrs   []string
	calls     map[string]int
	oks       map[string]int
	history   map[string][]string  // id → what happened to it, for failure reports
	callers   map[string][]string  // id → "<consumer> <attempt>" of each handler call
	callAt    map[string]time.Time // "<consumer> <id>" → its latest call
	successes []success
	lastOK    time.Time
	lastCall  time.Time
	pubMax    time.Duration                // the longest Publish call
	pubAt     map[string]time.Time         // id → when its Publish returned nil
	delays    map[string]time.Duration     // id → the delay it was published with
	callFirst map[string]map[int]time.Time // id → attempt → its first handler call
	marks     []time.Time                  // resume is measured from each
	hostile   []string                     // ids of the injected messages
	// kind is the kind of consumer process (children) that startConsumer starts: the
	// consumer ("" or childValue), or one of another case's.
	kind string
	// fateOf, when set, tells a message's fate from its id, for a case whose ids are not the
	// stream's (it publishes no delayed message).
	fateOf func(id string) fate
	// okEvents are the "ok" lines that carry the time their handler succeeded (ok <id> <unix
	// ns> [<lane>]), in the order they were read.
	okEvents []okEvent
	// handovers are the consumer processes killed, and the ones started in their place, of a
	// case that measures how fast lanes move (see laneTimes).
	handovers []handover
}

// handover is a consumer process killed at killed, and the one started in its place, ready at
// ready.
type handover struct {
	victim, joiner string
	killed, ready  time.Time
}

// okEvent is a handler's success, at the time the consumer process wrote into its line.
type okEvent struct {
	id       string
	consumer string
	at       time.Time // the process's clock (one machine: one clock)
	arrival  int       // the order in which the test read the lines, across processes
	lane     int       // the lane it came from, -1 when the line does not say
}

type success struct{ called, ok time.Time }

// newHarness starts a node and the consumer processes, and waits until they consume. The
// stream will have size messages.
func newHarness(t *testing.T, name string, size int) *harness {
	h := newLedger(t, name, size)
	h.node = testenv.StartNode(t)
	h.routerURL, h.pubURL = h.node.URL(), h.node.URL()
	h.start = time.Now()
	t.Logf("logs in %s; delay seed %d", h.logDir, h.seed)
	for range consumers {
		h.startConsumer()
	}
	for _, c := range h.live() {
		c.awaitReady(t)
	}
	return h
}

// newLedger returns a harness with its names, empty ledger and log directory, and nothing
// started.
func newLedger(t *testing.T, name string, size int) *harness {
	h := &harness{
		t: t, name: name, size: size,
		queue:      "faults." + name,
		delay:      topology.Delay{Prefix: "faults." + name + ".delay"},
		seed:       uint64(time.Now().UnixNano()),
		streamDone: make(chan struct{}),
		published:  map[string]bool{},
		calls:      map[string]int{},
		oks:        map[string]int{},
		history:    map[string][]string{},
		callers:    map[string][]string{},
		callAt:     map[string]time.Time{},
		pubAt:      map[string]time.Time{},
		delays:     map[string]time.Duration{},
		callFirst:  map[string]map[int]time.Time{},
	}
	h.redisPrefix = fmt.Sprintf("warren:faults:%s:%d:", name, h.seed)
	testenv.Redis(t, h.redisPrefix) // fails the case without Redis; deletes the keys after it
	h.logDir = t.TempDir()
	if dir := os.Getenv("FAULTS_LOGDIR"); dir != "" { // keep the logs
		h.logDir = filepath.Join(dir, name)
		if err := os.MkdirAll(h.logDir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

func (h *harness) since() string { return fmt.Sprintf("%.3fs", time.Since(h.start).Seconds()) }

func (h *harness) logger(name string) watermill.LoggerAdapter {
	f, err := os.Create(filepath.Join(h.logDir, name+".log"))
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = f.Close() })
	return watermill.NewStdLoggerWithOut(f, false, false)
}

// consumer is a consumer process.
type consumer struct {
	*proc
	name  string
	ready chan struct{}
	oks   atomic.Int64 // successful handler calls
}

// startConsumer starts a consumer process on h.routerURL; it does not wait until it
// consumes.
func (h *harness) startConsumer() *consumer { return h.startConsumerAt(h.routerURL) }

// startConsumerAt starts a consumer process whose router is given url; it does not wait
// until it consumes.
func (h *harness) startConsumerAt(url string) *consumer {
	h.mu.Lock()
	c := &consumer{name: fmt.Sprintf("c%d", len(h.consumers)+1), ready: make(chan struct{})}
	h.consumers = append(h.consumers, c)
	h.mu.Unlock()
	kind := h.kind
	if kind == "" {
		kind = childValue
	}
	c.proc = startProc(h.t, []string{childEnv + "=" + kind, childURL + "=" + url, childQueue + "=" + h.queue,
		childDelayName + "=" + h.delay.Prefix, childRedis + "=" + h.redisPrefix},
		filepath.Join(h.logDir, c.name+".log"), func(line string) { h.record(c, line) })
	return c
}

func (c *consumer) awaitReady(t *testing.T) { c.proc.awaitReady(t, "consumer "+c.name, c.ready) }

// proc is a child process of the test binary.
type proc struct {
	cmd     *exec.Cmd
	log     string        // the file of its stderr
	done    chan struct{} // closed once its output is read and it has exited
	waitErr error         // how it exited, once done is closed
}

// startProc starts the test binary as a child process, with env besides the test's own,
// its stderr into the file log, and each line it writes to stdout handed to onLine. It is
// killed when t ends.
func startProc(t testing.TB, env []string, log string, onLine func(string)) *proc {
	t.Helper()
	p := &proc{log: log, done: make(chan struct{})}
	stderr, err := os.Create(log)
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd = exec.Command(exe)
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start child process %s: %v", filepath.Base(log), err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			onLine(sc.Text())
		}
		p.waitErr = p.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// awaitReady waits until ready is closed, failing t when the process named name exits
// first or is not ready within testenv.Patience.
func (p *proc) awaitReady(t testing.TB, name string, ready <-chan struct{}) {
	t.Helper()
	select {
	case <-ready:
	case <-p.done:
		t.Fatalf("%s exited before it was ready: %v\n%s", name, p.waitErr, tail(p.log, 20))
	case <-time.After(testenv.Patience()):
		t.Fatalf("%s not ready within %s\n%s", name, testenv.Patience(), tail(p.log, 20))
	}
}

// record notes a line written by consumer c.
func (h *harness) record(c *consumer, line string) {
	now := time.Now()
	f := strings.Fields(line)
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case len(f) == 1 && f[0] == "ready":
		close(c.ready)
	case len(f) == 3 && f[0] == "call":
		id := f[1]
		if attempt, err := strconv.Atoi(f[2]); err == nil {
			if h.callFirst[id] == nil {
				h.callFirst[id] = map[int]time.Time{}
			}
			if _, seen := h.callFirst[id][attempt]; !seen {
				h.callFirst[id][attempt] = now
			}
		}
		h.calls[id]++
		h.callAt[c.name+" "+id] = now
		h.callers[id] = append(h.callers[id], c.name+" "+f[2])
		h.lastCall = now
		h.history[id] = append(h.history[id], fmt.Sprintf("%s %s call attempt %s", h.since(), c.name, f[2]))
	case len(f) >= 2 && len(f) <= 4 && f[0] == "ok":
		id := f[1]
		if len(f) >= 3 {
			ns, err := strconv.ParseInt(f[2], 10, 64)
			lane := -1
			if len(f) == 4 {
				lane, _ = strconv.Atoi(f[3])
			}
			if err != nil {
				h.t.Errorf("consumer %s wrote %q", c.name, line)
			}
			h.okEvents = append(h.okEvents, okEvent{id: id, consumer: c.name, at: time.Unix(0, ns), arrival: len(h.okEvents), lane: lane})
		}
		h.oks[id]++
		c.oks.Add(1)
		h.lastOK = now
		h.successes = append(h.successes, success{called: h.callAt[c.name+" "+id], ok: now})
		h.history[id] = append(h.history[id], fmt.Sprintf("%s %s ok", h.since(), c.name))
	default:
		h.t.Errorf("consumer %s wrote %q", c.name, line)
	}
}

// live returns the consumer processes that have not exited.
func (h *harness) live() []*consumer {
	h.mu.Lock()
	defer h.mu.Unlock()
	var cs []*consumer
	for _, c := range h.consumers {
		select {
		case <-c.done:
		default:
			cs = append(cs, c)
		}
	}
	return cs
}

// kill9 kills consumer c with SIGKILL and checks that it died of it.
func (h *harness) kill9(c *consumer) {
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		h.t.Fatalf("kill -9 consumer %s: %v", c.name, err)
	}
	select {
	case <-c.done:
	case <-time.After(testenv.Patience()):
		h.t.Fatalf("consumer %s still running 10s after kill -9", c.name)
	}
	var ee *exec.ExitError
	if !errors.As(c.waitErr, &ee) {
		h.t.Fatalf("consumer %s: exit %v, not killed", c.name, c.waitErr)
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		h.t.Fatalf("consumer %s: %v, not killed by SIGKILL", c.name, c.waitErr)
	}
	h.event(c.name + " killed")
}

// event notes what the harness did, for failure reports.
func (h *harness) event(what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.history["."] = append(h.history["."], h.since()+" "+what)
}

// redelivered counts the messages whose handler ran in consumer c and then ran again, for
// the same attempt, in another consumer: those c held when it died.
func (h *harness) redelivered(c *consumer) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, calls := range h.callers {
		for i, call := range calls {
			name, attempt, _ := strings.Cut(call, " ")
			if name == c.name && slices.ContainsFunc(calls[i+1:], func(later string) bool {
				ln, la, _ := strings.Cut(later, " ")
				return ln != name && la == attempt
			}) {
				n++
				break
			}
		}
	}
	return n
}

// stopConsumers ends every consumer process with SIGTERM (their routers close gracefully)
// and waits for them, killing those that do not end within 45s.
func (h *harness) stopConsumers() {
	cs := h.live()
	for _, c := range cs {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, c := range cs {
		select {
		case <-c.done:
			if c.waitErr != nil {
				h.t.Logf("consumer %s exited after SIGTERM: %v\n%s", c.name, c.waitErr, tail(c.log, 10))
			}
		case <-time.After(testenv.Patience()):
			h.t.Errorf("consumer %s did not exit within 45s of SIGTERM: killed", c.name)
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	}
}

// during fails the test when the stream has been published already: a fault must happen
// while messages flow, or it proves nothing.
func (h *harness) during(fault string) {
	h.t.Helper()
	select {
	case <-h.streamDone:
		h.t.Fatalf("%s after the stream was published: the harness did not keep up", fault)
	default:
	}
}

// crashBroker kills the node with SIGKILL and boots it again (testenv.Node.Crash), and
// marks the moment an AMQP client could first connect again.
func (h *harness) crashBroker() {
	answered := make(chan time.Time, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		down := false
		for {
			conn, err := amqp.DialConfig(h.node.URL(), amqp.Config{Dial: amqp.DefaultDial(time.Second)})
			switch {
			case err != nil:
				down = true
			case down:
				answered <- time.Now()
				_ = conn.Close()
				return
			default:
				_ = conn.Close()
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	h.event("broker kill -9")
	h.node.Crash()
	select {
	case at := <-answered:
		h.mu.Lock()
		h.marks = append(h.marks, at)
		h.history["."] = append(h.history["."], fmt.Sprintf("%.3fs broker answers again", at.Sub(h.start).Seconds()))
		h.mu.Unlock()
	case <-time.After(testenv.Patience()):
		h.t.Fatalf("the node does not answer AMQP clients 10s after it restarted")
	}
}

// mark notes a moment after a fault (the broker answering again, a connection closed, a
// consumer killed, a hostile message injected): processing must resume within
// resumeLimit of it.
func (h *harness) mark() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.marks = append(h.marks, time.Now())
}

// stream publishes the stream in the background at streamRate through a DLX publisher of
// the test process, with the default configuration: h.size messages, or more while the
// stream is held (see hold).
func (h *harness) stream() {
	pub := h.pub
	if pub == nil {
		pub = h.newPublisher(h.pubURL, "publisher")
	}
	h.streamStart = time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range publishers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if (i >= h.size && !h.held.Load()) || i >= maxStream {
					return
				}
				time.Sleep(time.Until(h.streamStart.Add(time.Duration(i) * time.Second / streamRate)))
				h.sent.Add(1)
				id := streamID(i)
				msg := message.NewMessage(id, []byte("payload of "+id))
				var d time.Duration
				if delayed(i) { // random, but the same for the same id and seed
					rng := rand.New(rand.NewPCG(h.seed, uint64(i)))
					d = minDelay + time.Duration(rng.Int64N(int64(maxDelay-minDelay)))
					warren.Delay(msg, d)
				}
				called := time.Now()
				err := pub.Publish(h.queue, msg)
				h.mu.Lock()
				h.pubMax = max(h.pubMax, time.Since(called))
				if err == nil {
					h.published[id] = true
					h.pubAt[id], h.delays[id] = time.Now(), d
					h.history[id] = append(h.history[id], fmt.Sprintf("%s published (delay %s)", h.since(), d.Round(time.Millisecond)))
				} else {
					h.pubErrs = append(h.pubErrs, err.Error())
					h.history[id] = append(h.history[id], fmt.Sprintf("%s publish failed: %v", h.since(), err))
				}
				h.mu.Unlock()
			}
		}()
	}
	go func() {
		wg.Wait()
		_ = pub.Close()
		h.streamEnd = time.Now()
		close(h.streamDone)
	}()
}

// newPublisher returns a DLX publisher of the test process on url, with the default
// configuration, logging into <logName>.log.
func (h *harness) newPublisher(url, logName string) *dlx.Publisher {
	pub, err := dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: url}, Topology: topology.Config{Delay: h.delay}},
		h.logger(logName))
	if err != nil {
		h.t.Fatalf("dlx.NewPublisher: %v", err)
	}
	return pub
}

// dialAny opens a connection with amqp091-go alone to the node, or to the first node of the
// cluster that answers.
func (h *harness) dialAny() (*amqp.Connection, error) {
	if h.cluster == nil {
		return amqp.Dial(h.node.URL())
	}
	var errs []error
	for _, n := range h.cluster.Up() {
		conn, err := amqp.DialConfig(n.URL(), amqp.Config{Dial: amqp.DefaultDial(2 * time.Second)})
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("no node answers: %w", errors.Join(errs...))
}

// ctl runs rabbitmqctl args... on the node, or on a node of the cluster that is up.
func (h *harness) ctl(args ...string) (string, error) {
	if h.cluster == nil {
		return h.node.Ctl(args...)
	}
	return h.cluster.Ctl(args...)
}

// hold keeps the stream going past its size until the returned function is called, so that
// faults that take long (rabbitmqctl on a busy machine) all happen while it flows.
func (h *harness) hold() (release func()) {
	h.held.Store(true)
	return func() { h.held.Store(false) }
}

// awaitSent waits until the stream has started publishing its k-th message.
func (h *harness) awaitSent(k int) {
	h.t.Helper()
	deadline := time.Now().Add(streamLimit)
	for h.sent.Load() < int64(k) {
		if time.Now().After(deadline) {
			h.t.Fatalf("stream: %d messages sent after %s, waiting for %d", h.sent.Load(), streamLimit, k)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// snapshot is what waits in the node's queues.
type snapshot struct{ work, delayed, parked, poison int }

// monitor reads queue counts on a connection of its own, reconnecting when it is lost.
type monitor struct {
	h    *harness
	conn *amqp.Connection
	ch   *amqp.Channel
}

func (m *monitor) count(queue string) (int, error) {
	if m.ch == nil || m.ch.IsClosed() {
		if m.conn == nil || m.conn.IsClosed() {
			conn, err := m.h.dialAny()
			if err != nil {
				return 0, err
			}
			m.conn = conn
		}
		ch, err := m.conn.Channel()
		if err != nil {
			return 0, err
		}
		m.ch = ch
	}
	q, err := m.ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	return q.Messages, err
}

func (m *monitor) snapshot() (snapshot, error) {
	var s snapshot
	var err error
	if s.work, err = m.count(m.h.queue); err != nil {
		return s, err
	}
	if s.poison, err = m.count(topology.PoisonQueue(m.h.queue)); err != nil {
		return s, err
	}
	if s.parked, err = m.count(m.h.delay.ParkingQueue()); err != nil {
		return s, err
	}
	queues, _ := m.h.delay.Names()
	for _, q := range queues {
		if q == m.h.delay.ParkingQueue() {
			continue
		}
		n, err := m.count(q)
		if err != nil {
			return s, err
		}
		s.delayed += n
	}
	return s, nil
}

func (m *monitor) close() {
	if m.conn != nil {
		_ = m.conn.Close()
	}
}

// settle waits until the stream is published and then until nothing moves (no handler call,
// queue counts unchanged, nothing in the work queue, the delay levels or the parking queue),
// and returns "" — or why it stopped waiting: nothing processed for stallAfter while messages
// waited, or settleLimit passed.
func (h *harness) settle(m *monitor) string {
	select {
	case <-h.streamDone:
	case <-time.After(streamLimit):
		h.t.Fatalf("stream: not published after %s (%d sent)", streamLimit, h.sent.Load())
	}
	deadline := time.Now().Add(settleLimit)
	var prev snapshot
	changed := time.Now()
	for {
		time.Sleep(500 * time.Millisecond)
		now := time.Now()
		s, err := m.snapshot()
		if err != nil || s != prev {
			changed, prev = now, s
		}
		h.mu.Lock()
		lastCall, lastOK := h.lastCall, h.lastOK
		h.mu.Unlock()
		idle := now.Sub(later(changed, lastCall))
		starved := now.Sub(later(lastOK, h.streamEnd)) >= stallAfter
		switch {
		case err == nil && s.work == 0 && s.delayed == 0 && idle >= quietFor:
			// Ready counts are zero; the broker may still hold messages (unacked, or in a
			// quorum queue's dead-letter worker): only its full counts tell.
			held := h.inQueues()
			if len(held) == 0 {
				return ""
			}
			if starved {
				return fmt.Sprintf("nothing processed for %s while the broker holds messages and delivers none: %v", stallAfter, held)
			}
		case err == nil && s.work > 0 && starved:
			return fmt.Sprintf("nothing processed for %s while %d messages wait in %s", stallAfter, s.work, h.queue)
		case now.After(deadline):
			return fmt.Sprintf("still moving %s after the stream (last snapshot %+v, error %v)", settleLimit, s, err)
		}
	}
}

// inQueues returns the queues of the node other than poison queues and the lanes' held queues
// (and their state) that hold messages, by the
// broker's full count (ready, unacknowledged, and held by a quorum queue's dead-letter
// worker).
func (h *harness) inQueues() map[string]int {
	out, err := h.ctl("list_queues", "--quiet", "--no-table-headers", "name", "messages")
	if err != nil {
		h.t.Fatalf("list_queues: %v\n%s", err, out)
	}
	held := map[string]int{}
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) != 2 || strings.HasSuffix(f[0], ".poison") ||
			f[0] == topology.HeldState(h.queue) || strings.HasSuffix(f[0], ".held") {
			continue // held keys wait for an operator: see releaseHeld
		}
		if n, err := strconv.Atoi(f[1]); err == nil && n > 0 {
			held[f[0]] = n
		}
	}
	return held
}

// drainPoison empties the poison queue and returns the ids of the stream found there, with
// their reasons, how many copies of them there were beyond one, the ids of others (injected
// messages), and the number of messages that amqp091-go could not parse (their connection closes with a frame error; they are fetched
// with no-ack, one at a time, so that each such closing is one message).
func (h *harness) drainPoison() (stream map[string]string, copies int, others []string, unparseable int) {
	stream = map[string]string{}
	queue := topology.PoisonQueue(h.queue)
	for {
		conn, err := h.dialAny()
		if err != nil {
			h.t.Fatalf("drain %s: %v", queue, err)
		}
		closed := conn.NotifyClose(make(chan *amqp.Error, 1))
		ch, err := conn.Channel()
		if err != nil {
			h.t.Fatalf("drain %s: %v", queue, err)
		}
		for {
			d, ok, err := ch.Get(queue, true)
			if err != nil {
				cerr := <-closed
				if cerr == nil || cerr.Code != amqp.FrameError {
					h.t.Fatalf("drain %s: %v (connection: %v)", queue, err, cerr)
				}
				unparseable++
				break
			}
			if !ok {
				_ = conn.Close()
				return stream, copies, others, unparseable
			}
			if _, mine := parseStreamID(d.MessageId); mine {
				if _, seen := stream[d.MessageId]; seen {
					copies++
				}
				stream[d.MessageId] = fmt.Sprintf("%v", d.Headers[warren.PoisonReasonKey])
			} else {
				others = append(others, d.MessageId)
			}
		}
		_ = conn.Close()
	}
}

// copiesOf returns the most distinct consumer processes that handled one attempt of a
// message, from its handler calls ("<consumer> <attempt>"): 2 or more when a copy of it (a
// publish sent twice, a redelivery after a lost ack or a killed consumer) reached another
// process and was handled there too.
func copiesOf(calls []string) int {
	byAttempt := map[string]map[string]bool{}
	for _, c := range calls {
		consumer, attempt, _ := strings.Cut(c, " ")
		if byAttempt[attempt] == nil {
			byAttempt[attempt] = map[string]bool{}
		}
		byAttempt[attempt][consumer] = true
	}
	n := 1
	for _, consumers := range byAttempt {
		n = max(n, len(consumers))
	}
	return n
}

// result is one case's line.
type result struct {
	published, processed, poisoned, lost, duplicates  int
	maxCalls, resumeMaxMs, inFlight, faults, dupLimit int
	split                                             int
	wrongPoison, inBoth, stuck, hostileIn, hostileOut int
	publishErrors, poisonDups                         int
	stalled                                           bool
	rate, secs                                        float64
}

func (r result) line(name string) string {
	return fmt.Sprintf("faults case=%s published=%d processed=%d poisoned=%d lost=%d duplicates=%d max_calls=%d "+
		"split=%d "+
		"resume_max_ms=%d in_flight_at_fault=%d faults=%d dup_limit=%d poison_dups=%d wrong_poison=%d in_both=%d stuck=%d "+
		"stalled=%t hostile_injected=%d hostile_poisoned=%d publish_errors=%d rate=%.0f secs=%.0f",
		name, r.published, r.processed, r.poisoned, r.lost, r.duplicates, r.maxCalls, r.split,
		r.resumeMaxMs, r.inFlight, r.faults, r.dupLimit, r.poisonDups, r.wrongPoison, r.inBoth, r.stuck,
		r.stalled, r.hostileIn, r.hostileOut, r.publishErrors, r.rate, r.secs)
}

// finish waits for the case to settle, stops the consumers, counts where every message
// ended, prints the case's line, fails the test on what the suite forbids, and returns the
// line's figures.
func (h *harness) finish() result {
	t := h.t
	m := &monitor{h: h}
	defer m.close()
	stalled := h.settle(m)
	h.stopConsumers()
	h.checkRaces()
	left := h.inQueues() // consumers gone: what they held is back in the queues
	poisonIDs, poisonDups, others, unparseable := h.drainPoison()

	h.mu.Lock()
	defer h.mu.Unlock()
	inFlight := router.Config{}.WithDefaults().Concurrency * consumers
	r := result{
		published: len(h.published), processed: len(h.oks), poisoned: len(poisonIDs), poisonDups: poisonDups,
		inFlight: inFlight, faults: len(h.marks), dupLimit: inFlight * len(h.marks),
		stalled:   stalled != "",
		hostileIn: len(h.hostile), publishErrors: len(h.pubErrs),
		rate: float64(h.sent.Load()) / h.streamEnd.Sub(h.streamStart).Seconds(),
		secs: time.Since(h.start).Seconds(),
	}
	var lost, inBoth, wrong []string
	for id := range h.published {
		_, ok := h.oks[id]
		_, poisoned := poisonIDs[id]
		switch {
		case !ok && !poisoned:
			lost = append(lost, id)
		case ok && poisoned:
			inBoth = append(inBoth, id)
		}
	}
	for id, reason := range poisonIDs {
		if i, _ := parseStreamID(id); fateOf(i) != failsAlway {
			wrong = append(wrong, id+" ("+reason+")")
		}
	}
	r.lost, r.inBoth, r.wrongPoison = len(lost), len(inBoth), len(wrong)
	for _, n := range left {
		r.stuck += n
	}
	for _, n := range h.oks {
		r.duplicates += n - 1
	}
	for id, n := range h.calls {
		if _, mine := parseStreamID(id); mine {
			r.maxCalls = max(r.maxCalls, n)
			if copiesOf(h.callers[id]) > 1 {
				r.split++
			}
		}
	}
	for _, id := range others {
		if slices.Contains(h.hostile, id) {
			r.hostileOut++
		} else {
			t.Errorf("poison queue holds %q, not a message of the case", id)
		}
	}
	r.hostileOut += unparseable
	r.resumeMaxMs = h.resumeMax()

	fmt.Println(r.line(h.name))

	// Nothing may pass vacuously.
	if r.published < minPublished {
		t.Errorf("only %d of %d messages published (min %d): %s", r.published, h.size, minPublished, firsts(h.pubErrs, 3))
	}
	if r.faults == 0 {
		t.Errorf("no fault happened")
	}
	retried := 0
	for id := range h.oks {
		if i, _ := parseStreamID(id); fateOf(i) == failsOnce && slices.ContainsFunc(h.callers[id], func(c string) bool {
			return !strings.HasSuffix(c, " 1")
		}) {
			retried++
		}
	}
	if retried == 0 || r.poisoned == 0 {
		t.Errorf("the stream proved nothing: %d messages processed after a retry, %d poisoned", retried, r.poisoned)
	}
	if r.hostileOut > r.hostileIn {
		t.Errorf("%d unparseable messages in the poison queue, %d injected", r.hostileOut, r.hostileIn)
	}
	// What the suite forbids.
	if stalled != "" {
		t.Errorf("stalled: %s", stalled)
	}
	if r.lost > 0 {
		sort.Strings(lost)
		t.Errorf("%d messages lost (published, neither processed nor poisoned); %d messages are still in the queues (see below). First ones:\n%s",
			r.lost, r.stuck, h.histories(lost, 10))
	}
	if r.stuck > 0 {
		t.Errorf("%d messages left in the queues after the consumers stopped (the broker holds them, it did not deliver them): %v", r.stuck, left)
	}
	if r.inBoth > 0 {
		sort.Strings(inBoth)
		t.Errorf("%d messages both processed and poisoned:\n%s", r.inBoth, h.histories(inBoth, 5))
	}
	if r.wrongPoison > 0 {
		sort.Strings(wrong)
		t.Errorf("%d messages poisoned that fail only once (a retry would have succeeded): %s\n%s",
			r.wrongPoison, firsts(wrong, 10), h.histories(wrong, 5))
	}
	if r.maxCalls > maxAttempts+1 {
		var worst []string
		for id, n := range h.calls {
			if _, mine := parseStreamID(id); mine && n > maxAttempts+1 {
				worst = append(worst, id)
			}
		}
		sort.Slice(worst, func(i, j int) bool { return h.calls[worst[i]] > h.calls[worst[j]] })
		t.Errorf("a handler was called %d times for one message (limit MaxAttempts+1 = %d); %d messages over it:\n%s",
			r.maxCalls, maxAttempts+1, len(worst), h.histories(worst, 3))
	}
	if r.resumeMaxMs < 0 || r.resumeMaxMs > int(resumeLimit.Milliseconds()) {
		t.Errorf("processing resumed %d ms after a fault (limit %s; -1: never)", r.resumeMaxMs, resumeLimit)
	}
	if r.duplicates > r.dupLimit {
		t.Errorf("%d duplicates, more than the %d messages in flight at the %d faults", r.duplicates, r.dupLimit, r.faults)
	}
	if r.hostileOut < r.hostileIn {
		t.Errorf("%d of %d injected unparseable messages are in the poison queue", r.hostileOut, r.hostileIn)
	}
	if t.Failed() {
		h.logSummary()
	}
	return r
}

// resumeMax is the longest time from a mark to the next successful handler call that
// started after it, in milliseconds; -1 when processing never resumed after a mark.
func (h *harness) resumeMax() int {
	worst := 0
	for _, m := range h.marks {
		first := time.Time{}
		for _, s := range h.successes {
			if !s.called.Before(m) && (first.IsZero() || s.ok.Before(first)) {
				first = s.ok
			}
		}
		if first.IsZero() {
			return -1
		}
		worst = max(worst, int(first.Sub(m).Milliseconds()))
	}
	return worst
}

// histories tells what happened to (at most n of) ids.
func (h *harness) histories(ids []string, n int) string {
	var b strings.Builder
	for _, id := range ids[:min(n, len(ids))] {
		id, _, _ = strings.Cut(id, " ")
		i, _ := parseStreamID(id)
		f, d := fateOf(i), delayed(i)
		if h.fateOf != nil {
			f, d = h.fateOf(id), false
		}
		ev := h.history[id]
		if len(ev) > 12 {
			ev = append(append(ev[:6:6], fmt.Sprintf("… %d more …", len(ev)-12)), ev[len(ev)-6:]...)
		}
		fmt.Fprintf(&b, "  %s (fate %d, delayed %t, %d calls, %d ok): %s\n",
			id, f, d, h.calls[id], h.oks[id], strings.Join(ev, "; "))
	}
	if ev := h.history["."]; len(ev) > 0 {
		fmt.Fprintf(&b, "  events: %s\n", strings.Join(ev, "; "))
	}
	return b.String()
}

var logMsg = regexp.MustCompile(`level=(\w+)\s+msg="([^"]*)"`)

// logSummary logs, per process, how often each log message was written, and its races.
func (h *harness) logSummary() {
	files, _ := filepath.Glob(filepath.Join(h.logDir, "*.log"))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		counts := map[string]int{}
		var other []string
		for _, l := range strings.Split(string(data), "\n") {
			if m := logMsg.FindStringSubmatch(l); m != nil {
				counts[m[1]+" "+m[2]]++
			} else if strings.TrimSpace(l) != "" && len(other) < 5 {
				other = append(other, l)
			}
		}
		var lines []string
		for k, n := range counts {
			lines = append(lines, fmt.Sprintf("    %5d× %s", n, k))
		}
		sort.Strings(lines)
		h.t.Logf("%s:\n%s\n%s", filepath.Base(f), strings.Join(lines, "\n"), strings.Join(other, "\n"))
	}
}

// checkRaces fails the test when a consumer process reported a data race.
func (h *harness) checkRaces() {
	for _, c := range h.consumers {
		if data, err := os.ReadFile(c.log); err == nil && strings.Contains(string(data), "WARNING: DATA RACE") {
			h.t.Errorf("consumer %s reported a data race:\n%s", c.name, tail(c.log, 60))
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func firsts(s []string, n int) string {
	if len(s) > n {
		return strings.Join(s[:n], "; ") + fmt.Sprintf("; … (%d in all)", len(s))
	}
	return strings.Join(s, "; ")
}

func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// dialRaw opens a connection of the test's own to the node, with amqp091-go alone.
func (h *harness) dialRaw() *amqp.Connection {
	conn, err := amqp.Dial(h.node.URL())
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// publishRaw publishes p to queue on a channel of its own (mandatory, confirmed) and fails
// the test unless the broker took it.
func (h *harness) publishRaw(conn *amqp.Connection, queue string, p amqp.Publishing) {
	ch, err := conn.Channel()
	if err != nil {
		h.t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		h.t.Fatal(err)
	}
	returned := ch.NotifyReturn(make(chan amqp.Return, 1))
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience())
	defer cancel()
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, p)
	if err != nil {
		h.t.Fatalf("publish %s to %s: %v", p.MessageId, queue, err)
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		h.t.Fatalf("publish %s to %s: not confirmed (%v)", p.MessageId, queue, err)
	}
	select { // a return comes before the confirm
	case r := <-returned:
		h.t.Fatalf("publish %s to %s: returned: %s", p.MessageId, queue, r.ReplyText)
	default:
	}
}
