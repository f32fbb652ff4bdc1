package router_test

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/consumer"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// fleet is a set of consumer processes (see consumerProcess) on one queue.
type fleet struct {
	t                          *testing.T
	env                        *testenv.Env
	queue, delayPrefix, secret string
	mu                         sync.Mutex
	processed                  map[string]int
	events                     []fleetEvent
	ready                      int
	procs                      []*exec.Cmd
	readers                    sync.WaitGroup
}

type fleetEvent struct {
	handler, state string
	at             time.Time
}

func newFleet(t *testing.T, env *testenv.Env, queue, delayPrefix, secret string) *fleet {
	f := &fleet{t: t, env: env, queue: queue, delayPrefix: delayPrefix, secret: secret, processed: map[string]int{}}
	t.Cleanup(f.stop)
	return f
}

// start starts n processes of `consumers` handlers each and waits until they run.
func (f *fleet) start(n, consumers int) {
	f.t.Helper()
	f.mu.Lock()
	want := f.ready + n
	f.mu.Unlock()
	for range n {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "WARREN_TEST_CHILD=consumers", "URL="+f.env.URL, "QUEUE="+f.queue,
			"DELAY_PREFIX="+f.delayPrefix, "SECRET="+f.secret, "CONSUMERS="+strconv.Itoa(consumers))
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		require.NoError(f.t, err)
		require.NoError(f.t, cmd.Start())
		f.procs = append(f.procs, cmd)
		f.readers.Add(1)
		go f.read(stdout)
	}
	require.Eventually(f.t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.ready >= want
	}, testenv.Patience(), 10*time.Millisecond, "consumer processes did not start")
}

func (f *fleet) read(stdout interface{ Read([]byte) (int, error) }) {
	defer f.readers.Done()
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		f.mu.Lock()
		switch {
		case len(fields) == 1 && fields[0] == "ready":
			f.ready++
		case len(fields) == 2 && fields[0] == "processed":
			f.processed[fields[1]]++
		case len(fields) == 4 && fields[0] == "event":
			ns, _ := strconv.ParseInt(fields[3], 10, 64)
			f.events = append(f.events, fleetEvent{fields[1], fields[2], time.Unix(0, ns)})
		}
		f.mu.Unlock()
	}
}

// stop sends SIGTERM to every process and waits for them.
func (f *fleet) stop() {
	for _, p := range f.procs {
		_ = p.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range f.procs {
		_ = p.Wait()
	}
	f.procs = nil
	f.readers.Wait()
}

// handlers returns the distinct handlers with an event in state since since.
func (f *fleet) handlers(state string, since time.Time) map[string]time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	hs := map[string]time.Time{}
	for _, e := range f.events {
		if e.state == state && !e.at.Before(since) {
			hs[e.handler] = e.at
		}
	}
	return hs
}

func (f *fleet) awaitHandlers(state string, n int, since time.Time, timeout time.Duration) map[string]time.Time {
	f.t.Helper()
	require.Eventually(f.t, func() bool { return len(f.handlers(state, since)) >= n }, timeout, 5*time.Millisecond,
		"%d of %d consumers %s", len(f.handlers(state, since)), n, state)
	return f.handlers(state, since)
}

func (f *fleet) count() (distinct, total int, dups []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, n := range f.processed {
		total += n
		if n > 1 {
			dups = append(dups, id)
		}
	}
	return len(f.processed), total, dups
}

// publisher publishes numbered messages to queue every interval until stopped; it returns
// how many Publish confirmed.
type publisher struct {
	stop chan struct{}
	done chan int
}

func publish(t *testing.T, env *testenv.Env, queue string, every time.Duration) *publisher {
	pub, err := dlx.NewPublisher(dlx.Config{Connection: env.Connection(), Topology: topology.Config{Delay: env.Delay(topology.Delay{})}}, nil)
	require.NoError(t, err)
	p := &publisher{stop: make(chan struct{}), done: make(chan int, 1)}
	go func() {
		defer pub.Close()
		n := 0
		for {
			select {
			case <-p.stop:
				p.done <- n
				return
			case <-time.After(every):
			}
			if err := pub.Publish(queue, message.NewMessage(strconv.Itoa(n), nil)); err != nil {
				t.Errorf("publish: %v", err)
				p.done <- n
				return
			}
			n++
		}
	}()
	return p
}

func (p *publisher) halt() int {
	close(p.stop)
	return <-p.done
}

func newKiller(t *testing.T, env *testenv.Env, secret string) *kill.Killer {
	return killerOf(t, env, kill.Config{Secret: []byte(secret)})
}

// killerOf returns a Killer of cfg on env's broker.
func killerOf(t *testing.T, env *testenv.Env, cfg kill.Config) *kill.Killer {
	t.Helper()
	cfg.Connection = env.Connection()
	k, err := kill.NewKiller(cfg, env.Logger())
	require.NoError(t, err)
	return k
}

// 3 processes × 4 consumers of one queue while messages flow: one kill stops all 12; every
// message published was processed exactly once or is still in the queue. A consumer started
// after the kill does not consume; after a resume every consumer does, and everything is
// processed exactly once.
func TestKillStopsEveryConsumerInEveryProcess(t *testing.T) {
	t.Parallel()
	env, queue, f, pub := flowing(t, "killed")

	sent := time.Now()
	require.NoError(t, newKiller(t, env, "").Kill(context.Background(), queue, kill.Stop))
	stopped := f.awaitHandlers("stopped", 12, sent, testenv.Patience())
	var last time.Time
	for _, at := range stopped {
		if at.After(last) {
			last = at
		}
	}
	t.Logf("12 consumers in 3 processes stopped %s after the kill was sent", last.Sub(sent).Round(time.Millisecond))

	published := pub.halt()
	before, _, _ := f.count()
	assert.Never(t, func() bool { d, _, _ := f.count(); return d != before }, 500*time.Millisecond, 10*time.Millisecond,
		"a consumer processed messages after it stopped")
	after, total, dups := f.count()
	assert.Equal(t, before, after, "a consumer processed messages after it stopped")
	assert.Empty(t, dups, "processed twice")
	q := inspectQueue(t, env, queue)
	assert.Zero(t, q.Consumers, "consumers left on the queue")
	assert.Equal(t, published, total+q.Messages, "processed + in the queue = published")
	t.Logf("published %d: %d processed, %d in the queue", published, total, q.Messages)

	// Started after the kill: it does not consume.
	since := time.Now()
	f.start(1, 4)
	f.awaitHandlers("stopped", 4, since, testenv.Patience())
	assert.Never(t, func() bool { d, _, _ := f.count(); return d != after }, 300*time.Millisecond, 10*time.Millisecond,
		"a consumer started after the kill consumed")
	late, _, _ := f.count()
	assert.Equal(t, after, late, "a consumer started after the kill consumed")

	// Resume: all 16 consume again, and every message is processed exactly once.
	since = time.Now()
	require.NoError(t, newKiller(t, env, "").Resume(context.Background(), queue))
	f.awaitHandlers("resumed", 16, since, testenv.Patience())
	require.Eventually(t, func() bool { d, _, _ := f.count(); return d == published }, testenv.Patience(), 10*time.Millisecond)
	_, total, dups = f.count()
	assert.Equal(t, published, total)
	assert.Empty(t, dups)
}

// A kill with delete: the consumers drain the queue, then it is deleted, with its poison
// queue, kill exchange and kill state queue; every message was processed exactly once.
func TestKillDeleteDrainsThenDeletesTheQueue(t *testing.T) {
	t.Parallel()
	env, queue, f, pub := flowing(t, "deleted")

	sent := time.Now()
	require.NoError(t, newKiller(t, env, "").Kill(context.Background(), queue, kill.Delete))
	published := pub.halt()
	f.awaitHandlers("deleted", 12, sent, testenv.Patience())

	ch := env.Channel()
	_, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	assert.ErrorContains(t, err, "NOT_FOUND", "the queue is gone")
	assert.Eventually(t, func() bool {
		ch := env.Channel()
		return ch.ExchangeDeclarePassive(topology.KillExchange(queue), "fanout", true, false, false, false, nil) != nil
	}, testenv.Patience(), 50*time.Millisecond, "the kill exchange is gone")
	_, err = env.Channel().QueueDeclarePassive(topology.PoisonQueue(queue), true, false, false, false, nil)
	assert.ErrorContains(t, err, "NOT_FOUND", "the empty poison queue is gone")
	_, err = env.Channel().QueueDeclarePassive(kill.StateQueue(queue, nil), true, false, false, false, nil)
	assert.ErrorContains(t, err, "NOT_FOUND", "the kill state queue is gone")

	distinct, total, dups := f.count()
	assert.Equal(t, published, distinct, "every message published was processed")
	assert.Equal(t, published, total)
	assert.Empty(t, dups)
}

// With a secret, an unsigned kill and a wrongly signed one change nothing; a signed one stops.
func TestKillWithSecretRefusesUnsignedAndWronglySigned(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("guarded")
	delay := env.Delay(topology.Delay{})
	const secret = "s3cret"
	for _, s := range []string{secret, "not the secret"} { // the state queues the killers make
		env.Remove([]string{kill.StateQueue(queue, []byte(s))}, nil)
	}
	f := newFleet(t, env, queue, delay.Prefix, secret)
	f.start(1, 2)
	pub := publish(t, env, queue, time.Millisecond)
	defer pub.halt()

	since := time.Now()
	for _, k := range []*kill.Killer{newKiller(t, env, ""), newKiller(t, env, "not the secret")} {
		require.NoError(t, k.Kill(context.Background(), queue, kill.Stop))
	}
	f.awaitHandlers("refused", 2, since, testenv.Patience())
	before, _, _ := f.count()
	require.Eventually(t, func() bool { d, _, _ := f.count(); return d > before+50 }, testenv.Patience(), 5*time.Millisecond,
		"consumers stopped on a refused kill")
	assert.Empty(t, f.handlers("stopped", since))

	signed := newKiller(t, env, secret)
	since = time.Now()
	require.NoError(t, signed.Kill(context.Background(), queue, kill.Stop))
	f.awaitHandlers("stopped", 2, since, testenv.Patience())
	require.NoError(t, signed.Resume(context.Background(), queue))
}

// flowing starts 3 processes × 4 consumers of a queue of the test's own, and a publisher,
// and returns once 300 messages were processed.
func flowing(t *testing.T, what string) (*testenv.Env, string, *fleet, *publisher) {
	env := testenv.New(t)
	queue := env.Queue(what)
	f := newFleet(t, env, queue, env.Delay(topology.Delay{}).Prefix, "")
	f.start(3, 4)
	pub := publish(t, env, queue, time.Millisecond)
	require.Eventually(t, func() bool { d, _, _ := f.count(); return d >= 300 }, testenv.Patience(), 5*time.Millisecond)
	return env, queue, f, pub
}

func inspectQueue(t *testing.T, env *testenv.Env, queue string) struct{ Messages, Consumers int } {
	t.Helper()
	q, err := env.Channel().QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return struct{ Messages, Consumers int }{q.Messages, q.Consumers}
}

// probe is a router of the test's own with one handler on a queue: it counts the messages
// processed and records the kill events.
type probe struct {
	r         *router.Router
	processed atomic.Int64
	mu        sync.Mutex
	events    []router.KillEvent
}

func startProbe(t *testing.T, env *testenv.Env, queue, secret string) *probe {
	t.Helper()
	p := &probe{}
	p.r = newRouter(t, env, func(c *router.Config) {
		c.KillSecret = []byte(secret)
		c.OnKill = func(e router.KillEvent) {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.events = append(p.events, e)
		}
	})
	require.NoError(t, p.r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(*message.Message) error {
		p.processed.Add(1)
		return nil
	}))
	start(t, p.r)
	return p
}

// await waits for a kill event in state and returns it.
func (p *probe) await(t *testing.T, state string) router.KillEvent {
	t.Helper()
	var found router.KillEvent
	require.Eventually(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, e := range p.events {
			if e.State == state {
				found = e
				return true
			}
		}
		return false
	}, testenv.Patience(), 5*time.Millisecond, "no %s event", state)
	return found
}

func (p *probe) states() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var s []string
	for _, e := range p.events {
		s = append(s, e.State)
	}
	return s
}

// flows publishes n messages to queue and waits until p processed them.
func (p *probe) flows(t *testing.T, env *testenv.Env, queue string, n int) {
	t.Helper()
	pub := newPublisherFor(t, env)
	want := p.processed.Load() + int64(n)
	for i := range n {
		require.NoError(t, pub.Publish(queue, message.NewMessage(strconv.Itoa(i), nil)))
	}
	require.Eventually(t, func() bool { return p.processed.Load() >= want }, testenv.Patience(), 5*time.Millisecond,
		"messages not processed: %d of %d", p.processed.Load(), want)
}

// consuming waits until queue has a consumer: its consumers listen to the kill topic by then.
func consuming(t *testing.T, env *testenv.Env, queue string) {
	t.Helper()
	ch := env.Channel()
	require.Eventually(t, func() bool {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err == nil && q.Consumers > 0
	}, testenv.Patience(), 5*time.Millisecond, "nobody consumes %s", queue)
}

// eavesdrop binds a queue of the test's own to queue's kill exchange, as anyone allowed to
// read it can, and returns the commands that pass.
func eavesdrop(t *testing.T, env *testenv.Env, queue string) <-chan amqp.Delivery {
	t.Helper()
	ch := env.Channel()
	kill := topology.KillExchange(queue)
	require.NoError(t, ch.ExchangeDeclare(kill, "fanout", true, false, false, false, nil))
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(q.Name, "", kill, false, nil))
	d, err := ch.Consume(q.Name, "", true, true, false, false, nil)
	require.NoError(t, err)
	return d
}

func next(t *testing.T, d <-chan amqp.Delivery) []byte {
	t.Helper()
	select {
	case m := <-d:
		return m.Body
	case <-time.After(testenv.Patience()):
		t.Fatal("no command went past")
		return nil
	}
}

// inject publishes body to queue's kill exchange, as anyone allowed to write to it can.
func inject(t *testing.T, env *testenv.Env, queue string, body []byte) {
	t.Helper()
	require.NoError(t, env.Channel().PublishWithContext(context.Background(), topology.KillExchange(queue), "", false, false,
		amqp.Publishing{ContentType: "application/json", Body: body}))
}

func signed(t *testing.T, queue string, action kill.Action, at time.Time, secret string) []byte {
	c := kill.Command{Queue: queue, Action: action, At: at.UTC()}
	c.Sign([]byte(secret))
	body, err := json.Marshal(c)
	require.NoError(t, err)
	return body
}

// A valid signed stop, captured as it went past and replayed after a resume,
// is refused by a consumer that started after both (the replay memory is the broker's, not
// the consumer's), and the consumer keeps consuming.
func TestKillReplayIsRefusedByALateStarter(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("replayed")
	const secret = "s3cret"
	env.Remove([]string{kill.StateQueue(queue, []byte(secret))}, nil)
	k := killerOf(t, env, kill.Config{Secret: []byte(secret), Force: true}) // before the queue exists
	captured := eavesdrop(t, env, queue)

	require.NoError(t, k.Kill(context.Background(), queue, kill.Stop))
	stop := next(t, captured)
	require.NoError(t, k.Resume(context.Background(), queue))

	p := startProbe(t, env, queue, secret)
	consuming(t, env, queue)
	p.flows(t, env, queue, 10)
	inject(t, env, queue, stop)
	refused := p.await(t, "refused")
	assert.ErrorContains(t, refused.Err, "replay")
	p.flows(t, env, queue, 10)
	assert.NotContains(t, p.states(), "stopped")
}

// A signed stop dated 50s ahead of the consumer's clock is refused (it would
// lock out every command dated before it); one dated 2s ahead, within KillClockSkew's
// default of 5s, is obeyed.
func TestKillDatedAheadIsRefused(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("ahead")
	const secret = "s3cret"
	p := startProbe(t, env, queue, secret)
	consuming(t, env, queue)

	inject(t, env, queue, signed(t, queue, kill.Stop, time.Now().Add(50*time.Second), secret))
	refused := p.await(t, "refused")
	assert.ErrorContains(t, refused.Err, "KillClockSkew")
	p.flows(t, env, queue, 10)
	assert.NotContains(t, p.states(), "stopped")

	inject(t, env, queue, signed(t, queue, kill.Stop, time.Now().Add(2*time.Second), secret))
	p.await(t, "stopped")
}

// A kill to a queue nobody listens to says so (ErrNoListener), and is
// remembered: a consumer started afterwards stays stopped. The same when the kill exchange
// was deleted (the consumer that was bound to it no longer hears anything).
func TestKillWithoutListenerSaysSoAndIsRemembered(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("unheard")
	k := killerOf(t, env, kill.Config{Force: true}) // before the queue exists

	err := k.Kill(context.Background(), queue, kill.Stop)
	require.ErrorIs(t, err, kill.ErrNoListener)
	assert.ErrorContains(t, err, queue)
	first := startProbe(t, env, queue, "")
	first.await(t, "stopped")
	pub := newPublisherFor(t, env)
	for i := range 10 {
		require.NoError(t, pub.Publish(queue, message.NewMessage(strconv.Itoa(i), nil)))
	}
	assert.Never(t, func() bool { return first.processed.Load() > 0 }, 500*time.Millisecond, 10*time.Millisecond,
		"a consumer started after the kill consumed")

	require.NoError(t, k.Resume(context.Background(), queue), "a consumer listens")
	first.await(t, "resumed")
	require.Eventually(t, func() bool { return first.processed.Load() == 10 }, testenv.Patience(), 5*time.Millisecond)

	require.NoError(t, env.Channel().ExchangeDelete(topology.KillExchange(queue), false, false))
	require.ErrorIs(t, k.Kill(context.Background(), queue, kill.Stop), kill.ErrNoListener)
	second := startProbe(t, env, queue, "")
	second.await(t, "stopped")
	// The first consumer, which no longer hears kills, takes every message; the second none.
	for i := range 10 {
		require.NoError(t, pub.Publish(queue, message.NewMessage("late-"+strconv.Itoa(i), nil)))
	}
	require.Eventually(t, func() bool { return first.processed.Load()+second.processed.Load() >= 20 }, testenv.Patience(),
		5*time.Millisecond)
	assert.Zero(t, second.processed.Load(), "a consumer started after the kill consumed")
}

// A kill with delete that nobody heard is remembered: a consumer started afterwards drains
// the queue, deletes it and its kill state, and ends.
func TestKillDeleteIsRememberedForALateStarter(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("deletedlate")
	pub := newPublisherFor(t, env)
	for i := range 20 {
		require.NoError(t, pub.Publish(queue, message.NewMessage(strconv.Itoa(i), nil)))
	}
	require.ErrorIs(t, newKiller(t, env, "").Kill(context.Background(), queue, kill.Delete), kill.ErrNoListener)

	p := startProbe(t, env, queue, "")
	p.await(t, "deleted")
	assert.EqualValues(t, 20, p.processed.Load())
	for _, q := range []string{queue, kill.StateQueue(queue, nil)} {
		_, err := env.Channel().QueueDeclarePassive(q, true, false, false, false, nil)
		assert.ErrorContains(t, err, "NOT_FOUND", "%s is gone", q)
	}
}

func TestKillClockSkewIsValidated(t *testing.T) {
	_, err := router.New(router.Config{Connection: warren.Connection{URL: "amqp://x/"}, KillClockSkew: -time.Second}, nil)
	assert.ErrorContains(t, err, "Config.KillClockSkew")
	_, err = consumer.NewSubscriber(consumer.Config{Connection: warren.Connection{URL: "amqp://x/"}, KillClockSkew: -time.Second}, nil)
	assert.ErrorContains(t, err, "consumer: Config.KillClockSkew")
}

// A pause whose stop outlived ShutdownTimeout cancels the context of the message that was
// still being handled, and never the context of a message handed out after the resume (a
// subscriber-wide context once made every later message start cancelled).
func TestShutdownTimeoutOfAPauseLeavesLaterMessagesAlive(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("session-ctx")
	msgs := subscribe(t, env, queue, consumer.Config{ShutdownTimeout: 200 * time.Millisecond})
	ch := env.Channel()
	receive := func(what string) *message.Message {
		t.Helper()
		select {
		case m := <-msgs:
			return m
		case <-time.After(testenv.Patience()):
			t.Fatalf("%s was not handed out", what)
			return nil
		}
	}

	require.NoError(t, ch.Publish("", queue, false, false, amqp.Publishing{MessageId: "held", Body: []byte("1")}))
	held := receive("the first message")
	k := newKiller(t, env, "")
	require.NoError(t, k.Kill(context.Background(), queue, kill.Stop))
	select { // the handler outlives ShutdownTimeout: its context ends
	case <-held.Context().Done():
	case <-time.After(testenv.Patience()):
		t.Fatal("the held message's context did not end after ShutdownTimeout")
	}
	held.Nack()

	require.NoError(t, k.Resume(context.Background(), queue))
	require.NoError(t, ch.Publish("", queue, false, false, amqp.Publishing{MessageId: "later", Body: []byte("2")}))
	for seen := map[string]bool{}; !seen["later"] || !seen["held"]; {
		m := receive("every message after the resume")
		assert.NoError(t, m.Context().Err(), "message %s was handed out after the resume with its context ended", m.UUID)
		seen[m.UUID] = true
		m.Ack()
	}
}
