package router_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
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
	}, 30*time.Second, 10*time.Millisecond, "consumer processes did not start")
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
	pub, err := dlx.NewPublisher(dlx.Config{URL: env.URL, Topology: topology.Config{Delay: env.Delay(topology.Delay{})}}, nil)
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

func newKiller(t *testing.T, env *testenv.Env, secret string) *router.Killer {
	k, err := router.NewKiller(router.KillerConfig{URL: env.URL, Secret: []byte(secret)}, nil)
	require.NoError(t, err)
	return k
}

// 3 processes × 4 consumers of one queue while messages flow: one kill stops all 12; every
// message published was processed exactly once or is still in the queue. A consumer started
// after the kill does not consume; after a resume every consumer does, and everything is
// processed exactly once.
func TestKillStopsEveryConsumerInEveryProcess(t *testing.T) {
	env, queue, f, pub := flowing(t, "killed")

	sent := time.Now()
	require.NoError(t, newKiller(t, env, "").Kill(context.Background(), queue, router.Stop))
	stopped := f.awaitHandlers("stopped", 12, sent, 10*time.Second)
	var last time.Time
	for _, at := range stopped {
		if at.After(last) {
			last = at
		}
	}
	t.Logf("12 consumers in 3 processes stopped %s after the kill was sent", last.Sub(sent).Round(time.Millisecond))

	published := pub.halt()
	before, _, _ := f.count()
	time.Sleep(500 * time.Millisecond)
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
	f.awaitHandlers("stopped", 4, since, 10*time.Second)
	time.Sleep(300 * time.Millisecond)
	late, _, _ := f.count()
	assert.Equal(t, after, late, "a consumer started after the kill consumed")

	// Resume: all 16 consume again, and every message is processed exactly once.
	since = time.Now()
	require.NoError(t, newKiller(t, env, "").Resume(context.Background(), queue))
	f.awaitHandlers("resumed", 16, since, 10*time.Second)
	require.Eventually(t, func() bool { d, _, _ := f.count(); return d == published }, 30*time.Second, 10*time.Millisecond)
	_, total, dups = f.count()
	assert.Equal(t, published, total)
	assert.Empty(t, dups)
}

// A kill with delete: the consumers drain the queue, then it is deleted, with its poison
// queue and kill exchange; every message was processed exactly once.
func TestKillDeleteDrainsThenDeletesTheQueue(t *testing.T) {
	env, queue, f, pub := flowing(t, "deleted")

	sent := time.Now()
	require.NoError(t, newKiller(t, env, "").Kill(context.Background(), queue, router.Delete))
	published := pub.halt()
	f.awaitHandlers("deleted", 12, sent, 20*time.Second)

	ch := env.Channel()
	_, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	assert.ErrorContains(t, err, "NOT_FOUND", "the queue is gone")
	assert.Eventually(t, func() bool {
		ch := env.Channel()
		return ch.ExchangeDeclarePassive(topology.KillExchange(queue), "fanout", true, false, false, false, nil) != nil
	}, 5*time.Second, 50*time.Millisecond, "the kill exchange is gone")
	_, err = env.Channel().QueueDeclarePassive(topology.PoisonQueue(queue), true, false, false, false, nil)
	assert.ErrorContains(t, err, "NOT_FOUND", "the empty poison queue is gone")

	distinct, total, dups := f.count()
	assert.Equal(t, published, distinct, "every message published was processed")
	assert.Equal(t, published, total)
	assert.Empty(t, dups)
}

// With a secret, an unsigned kill and a wrongly signed one change nothing; a signed one stops.
func TestKillWithSecretRefusesUnsignedAndWronglySigned(t *testing.T) {
	env := testenv.New(t)
	queue := env.Queue("guarded")
	delay := env.Delay(topology.Delay{})
	const secret = "s3cret"
	f := newFleet(t, env, queue, delay.Prefix, secret)
	f.start(1, 2)
	pub := publish(t, env, queue, time.Millisecond)
	defer pub.halt()

	since := time.Now()
	for _, k := range []*router.Killer{newKiller(t, env, ""), newKiller(t, env, "not the secret")} {
		require.NoError(t, k.Kill(context.Background(), queue, router.Stop))
		defer k.Resume(context.Background(), queue) // removes the marker it made; refused too
	}
	f.awaitHandlers("refused", 2, since, 10*time.Second)
	before, _, _ := f.count()
	require.Eventually(t, func() bool { d, _, _ := f.count(); return d > before+50 }, 10*time.Second, 5*time.Millisecond,
		"consumers stopped on a refused kill")
	assert.Empty(t, f.handlers("stopped", since))

	signed := newKiller(t, env, secret)
	since = time.Now()
	require.NoError(t, signed.Kill(context.Background(), queue, router.Stop))
	f.awaitHandlers("stopped", 2, since, 10*time.Second)
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
	require.Eventually(t, func() bool { d, _, _ := f.count(); return d >= 300 }, 30*time.Second, 5*time.Millisecond)
	return env, queue, f, pub
}

func inspectQueue(t *testing.T, env *testenv.Env, queue string) struct{ Messages, Consumers int } {
	t.Helper()
	q, err := env.Channel().QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return struct{ Messages, Consumers int }{q.Messages, q.Consumers}
}
