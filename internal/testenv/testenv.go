// Package testenv gives tests a real broker and names of their own, and removes what a test
// declared when it ends. A broker that does not answer fails the test: it is never a skip.
//
// Under `go test -short` every test that needs a broker or Redis (through New, NewAt,
// StartNode, StartCluster, Redis or NeedsBroker) is skipped, and so is every test that waits
// out real time limits (Slow), so that the unit tests run alone on a machine without them; a
// test of warren's own logic (through Logic) runs on an in-memory broker of its own instead.
// SkipExamplesIfShort skips a package's Examples so.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpurl"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/memrabbit"
	"github.com/warrenmq/warren/topology"
)

// URL is the broker the tests use: $WARREN_AMQP_URL, or the local one.
func URL() string {
	if u := os.Getenv("WARREN_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// ManagementURL is the management HTTP API of the broker the tests use:
// $WARREN_MANAGEMENT_URL, or the local one (http://guest:guest@127.0.0.1:15672/; `make broker`
// enables the plugin). A test that needs it fails when nothing answers there.
func ManagementURL() string {
	if u := os.Getenv("WARREN_MANAGEMENT_URL"); u != "" {
		return u
	}
	return "http://guest:guest@127.0.0.1:15672/"
}

// Env is one test's view of the broker.
type Env struct {
	t    testing.TB
	URL  string
	ID   string
	conn *amqp.Connection

	mu        sync.Mutex
	queues    []string
	exchanges []string
}

// NeedsBroker skips t under `go test -short`: it talks to a broker (or Redis, or starts
// nodes of its own).
func NeedsBroker(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a broker: not run with -short")
	}
}

// Slow skips t under `go test -short`: it needs no broker, but waits out real time limits
// (seconds).
func Slow(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("waits out real time limits: not run with -short")
	}
}

// SkipExamplesIfShort makes `go test -short` skip the Examples of the package whose TestMain
// calls it (before m.Run), unless -skip is given: they talk to a broker, and an Example
// cannot skip itself.
func SkipExamplesIfShort() {
	flag.Parse()
	if testing.Short() && flag.Lookup("test.skip").Value.String() == "" {
		_ = flag.Set("test.skip", "^Example")
	}
}

// New connects to the broker (failing t if it cannot) and removes, when t ends, every queue
// and exchange registered through the Env.
func New(t testing.TB) *Env {
	t.Helper()
	NeedsBroker(t)
	return NewAt(t, URL())
}

// Logic is New for a test of warren's own logic rather than of the broker's behaviour: under
// `go test -short` (make unit) its Env is an in-memory broker of the test's own
// (internal/memrabbit, RabbitMQ 3.10's behaviour, on the real clock), elsewhere the real
// broker, as New's. Such a test reaches the broker only through warren's components and
// the Env (not amqp.Dial), needs neither the management API nor Redis, and waits little
// real time.
func Logic(t testing.TB) *Env {
	t.Helper()
	if testing.Short() {
		return model(t)
	}
	return New(t)
}

// model is an Env on an in-memory broker of t's own, closed after t's cleanups.
func model(t testing.TB) *Env {
	t.Helper()
	b := memrabbit.New(memrabbit.Config{})
	t.Cleanup(func() { _ = b.Close() })
	return newEnv(t, b.URL())
}

// NewAt is New on the broker at url (a Node's, say).
func NewAt(t testing.TB, url string) *Env {
	t.Helper()
	NeedsBroker(t)
	return newEnv(t, url)
}

func newEnv(t testing.TB, url string) *Env {
	t.Helper()
	conn, err := connect(url, "warren test "+t.Name())
	if err != nil {
		t.Fatalf("no RabbitMQ at %s (start it with `make broker`): %v", amqpurl.Redact(url), err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	e := &Env{t: t, URL: url, ID: hex.EncodeToString(b), conn: conn}
	t.Cleanup(e.cleanup)
	return e
}

// Connection is the Connection to the Env's broker, with Patience as its ConnectTimeout: a
// loaded machine can take longer than the default to connect and declare.
func (e *Env) Connection() warren.Connection {
	return warren.Connection{URL: e.URL, ConnectTimeout: Patience()}
}

// Name returns a name of this test's own, registered for nothing.
func (e *Env) Name(what string) string {
	n := strings.NewReplacer("/", ".", " ", "_").Replace(e.t.Name())
	if len(n) > 60 {
		n = n[len(n)-60:]
	}
	return "wt." + n + "." + e.ID + "." + what
}

// Queue returns a work queue name of this test's own and removes the queue, its poison queue
// and kill exchange when the test ends.
func (e *Env) Queue(what string) string {
	return e.TrackQueue(e.Name(what))
}

// WorkQueue declares a work queue of the test's own with its poison queue, as warren's
// topology declares them (no delay levels), and removes them when the test ends.
func (e *Env) WorkQueue(what string) string {
	e.t.Helper()
	q := e.Queue(what)
	b, err := topology.NewBuilder(topology.Config{Delay: topology.Delay{Disabled: true}}, nil)
	if err == nil {
		err = b.DeclareQueue(context.Background(), e.Channel(), topology.Queue{Name: q})
	}
	if err != nil {
		e.t.Fatalf("declare work queue %s: %v", q, err)
	}
	return q
}

// TrackQueue removes work queue q, its poison queue, kill exchange and kill state queue
// (without a kill secret: with one, register kill.StateQueue's name too) when the
// test ends.
func (e *Env) TrackQueue(q string) string {
	e.Remove(WorkQueueNames(q))
	return q
}

// Exchange returns an exchange name of this test's own, removed when the test ends.
func (e *Env) Exchange(what string) string {
	x := e.Name(what)
	e.Remove(nil, []string{x})
	return x
}

// Remove registers more queues and exchanges to delete when the test ends.
func (e *Env) Remove(queues, exchanges []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.queues = append(e.queues, queues...)
	e.exchanges = append(e.exchanges, exchanges...)
}

// LogDepths logs the messages and consumers of every queue registered for removal that
// exists and holds a message or has a consumer: where the messages are when a test waited
// for them in vain.
func (e *Env) LogDepths() {
	e.t.Helper()
	e.mu.Lock()
	queues := unique(append([]string(nil), e.queues...))
	e.mu.Unlock()
	for _, q := range queues {
		if i, err := e.Inspect(q); err == nil && (i.Messages > 0 || i.Consumers > 0) {
			e.t.Logf("queue %s: %d messages, %d consumers", q, i.Messages, i.Consumers)
		}
	}
}

// DelayRadix and DelayLevels are the delay levels Env.Delay gives a test that sets none:
// 16 levels of radix 2, one queue each (delays up to 65.5 s; no test delays longer), instead
// of the default's 193 quorum queues. Creating and deleting quorum queues is most of what the
// broker does in make test: 60 queues per test (4 levels of radix 16) made parallel tests on
// a loaded 2-core machine exceed the 30 s declare limit. The tests of dlx and topology cover
// the default radix and layout.
const (
	DelayRadix  = 2
	DelayLevels = 16
)

// Delay returns delay levels of this test's own (d with a Prefix of its own, DelayRadix and
// DelayLevels if none of Levels, Unit and Radix is set, and defaults), removed when the test
// ends. An unset QueueType stays unset, so that it follows topology.Config.QueueType; the
// levels of either type are removed then.
func (e *Env) Delay(d topology.Delay) topology.Delay {
	d.Prefix = e.Name("delay")
	if d.Levels == 0 && d.Unit == 0 && d.Radix == 0 {
		d.Radix, d.Levels = DelayRadix, DelayLevels
	}
	typ := d.QueueType
	for _, t := range []topology.QueueType{topology.Quorum, topology.Classic} {
		if typ == "" || typ == t {
			d.QueueType = t
			e.Remove(d.Names())
			e.Remove([]string{d.LedgerQueue()}, nil)
		}
	}
	d = d.WithDefaults()
	d.QueueType = typ
	return d
}

// Dial opens a connection of its own to the Env's broker, the in-memory one too (see Logic),
// which amqp.Dial cannot reach; its caller closes it. It dials as warren does (amqpx.Dial),
// guarded against unreadable headers: a test of an unguarded client dials amqp.Dial(e.URL).
func (e *Env) Dial() (*amqp.Connection, error) { return connect(e.URL, "warren test "+e.t.Name()) }

// connect connects to the broker at url as warren does (amqpx.Dial), for up to Patience:
// generous, as a loaded 2-core machine can take seconds for a handshake; a broker that does
// not answer still fails.
func connect(url, name string) (*amqp.Connection, error) {
	ctx, cancel := context.WithTimeout(context.Background(), Patience())
	defer cancel()
	conn, _, err := amqpx.Dial(ctx, warren.Connection{URL: url}, name)
	return conn, err
}

// Channel opens a channel, closed when the test ends.
func (e *Env) Channel() *amqp.Channel {
	e.t.Helper()
	ch, err := e.conn.Channel()
	if err != nil {
		e.t.Fatalf("open channel: %v", err)
	}
	e.t.Cleanup(func() { _ = ch.Close() })
	return ch
}

// Messages returns how many messages queue holds (ready ones).
func (e *Env) Messages(queue string) int {
	e.t.Helper()
	q, err := e.Inspect(queue)
	if err != nil {
		e.t.Fatalf("inspect queue %s: %v", queue, err)
	}
	return q.Messages
}

// Inspect declares queue passively on a channel of its own (a queue that does not exist
// closes it) and returns what the broker says of it. It fails no test, so that an
// Eventually or Never condition, which runs on another goroutine, can call it.
func (e *Env) Inspect(queue string) (amqp.Queue, error) {
	ch, err := e.conn.Channel()
	if err != nil {
		return amqp.Queue{}, err
	}
	defer ch.Close()
	return ch.QueueDeclarePassive(queue, true, false, false, false, nil)
}

// Logger is a Watermill logger for tests: silent unless $WARREN_TEST_LOG is set (to
// "debug" for debug output), as goroutines may log after their test has ended.
func (e *Env) Logger() watermill.LoggerAdapter {
	switch os.Getenv("WARREN_TEST_LOG") {
	case "":
		return watermill.NopLogger{}
	case "debug":
		return watermill.NewStdLogger(true, false)
	}
	return watermill.NewStdLogger(false, false)
}

func (e *Env) cleanup() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.conn.IsClosed() { // a test that restarted its node: connect again
		if err := DeleteAt(e.URL, e.queues, e.exchanges); err != nil {
			e.t.Errorf("cleanup: %v", err)
		}
		return
	}
	defer e.conn.Close()
	if err := deleteAll(e.conn, e.queues, e.exchanges); err != nil {
		e.t.Errorf("cleanup: %v", err)
	}
}

// DeleteAt removes queues and exchanges from the broker at url, ignoring those that do not
// exist: for examples and the benchmark, which have no test to clean up after them.
func DeleteAt(url string, queues, exchanges []string) error {
	conn, err := connect(url, "warren cleanup")
	if err != nil {
		return err
	}
	defer conn.Close()
	return deleteAll(conn, queues, exchanges)
}

// WorkQueueNames lists what declaring and killing the work queue q makes, besides its
// bindings: q, its poison queue, its kill exchange and its kill state queue (the name used
// without a kill secret, kill.StateQueue(q, nil): kill's tests check that it is this one).
func WorkQueueNames(q string) (queues, exchanges []string) {
	return []string{q, topology.PoisonQueue(q), topology.KillExchange(q) + ".state"}, []string{topology.KillExchange(q)}
}

func deleteAll(conn *amqp.Connection, queues, exchanges []string) error {
	// A name registered many times (a route that registers its exchange on every publish:
	// tens of thousands in the Pub/Sub suites) is deleted once.
	queues, exchanges = unique(queues), unique(exchanges)
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	for i, name := range append(append([]string{}, queues...), exchanges...) {
		if ch.IsClosed() { // a refusal closes the channel
			if ch, err = conn.Channel(); err != nil {
				return err
			}
		}
		if i < len(queues) {
			_, _ = ch.QueueDelete(name, false, false, false)
		} else {
			_ = ch.ExchangeDelete(name, false, false)
		}
	}
	return nil
}

// unique returns names without repeats, in the order of their first appearance.
func unique(names []string) []string {
	seen := make(map[string]bool, len(names))
	var out []string
	for _, n := range names {
		if !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	return out
}
