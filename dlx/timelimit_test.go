package dlx_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// The tests here measure time limits on the wall clock: none is parallel.

// A publisher (without delay levels) connected through a proxy whose broker then stops (the
// proxy closes: nothing listens any more) or hangs (the proxy freezes and drops the
// connection: a new one is accepted and never answered).
func proxiedPublisher(t *testing.T, env *testenv.Env, publishTimeout, connectTimeout time.Duration) (*dlx.Publisher, *testenv.Proxy, string) {
	t.Helper()
	proxy, url := testenv.ProxyURL(t, env.URL)
	q := env.Queue("limit")
	p, err := dlx.NewPublisher(dlx.Config{
		Connection:     warren.Connection{URL: url, ConnectTimeout: connectTimeout},
		Topology:       topology.Config{Delay: topology.Delay{Disabled: true}},
		PublishTimeout: publishTimeout,
	}, env.Logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	require.NoError(t, p.Publish(q, message.NewMessage("before", nil)))
	return p, proxy, q
}

// hang makes the proxy a broker that accepts connections and never answers, and drops the
// publisher's connection, so that its next call must dial.
func hang(t *testing.T, p *dlx.Publisher, proxy *testenv.Proxy) {
	t.Helper()
	proxy.Freeze()
	proxy.Drop()
	connectionLost(t, p)
}

// connectionLost waits until the publisher's client has seen its connection closed.
func connectionLost(t *testing.T, p *dlx.Publisher) {
	t.Helper()
	require.Eventually(t, p.ConnectionClosed, testenv.Patience(), 5*time.Millisecond, "the client does not see its connection closed")
}

// A stopped broker: every limit is kept and named in the error (cenkalti's MaxElapsedTime
// alone returns 6–42% early).
func TestTimeLimitsWithAStoppedBroker(t *testing.T) {
	env := testenv.New(t)
	p, proxy, q := proxiedPublisher(t, env, 2*time.Second, 2*time.Second)
	proxy.Close()
	connectionLost(t, p)

	start := time.Now()
	err := p.Publish(q, message.NewMessage("stopped", nil))
	testenv.WithinLimit(t, 2*time.Second, time.Since(start), "Publish")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `dlx: publish to "`+q+`": gave up after 2s: dial: `)
	assert.Contains(t, err.Error(), "connection refused")

	start = time.Now()
	_, err = dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: testenv.WithHost(t, env.URL, testenv.ClosedPort(t)), ConnectTimeout: 2 * time.Second}}, nil)
	testenv.WithinLimit(t, 2*time.Second, time.Since(start), "NewPublisher")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "gave up after 2s")
	assert.Contains(t, err.Error(), "connection refused")
}

// A broker that accepts TCP and never answers: the dial is bounded by the call's limit, not
// by ConnectTimeout alone (Publish with PublishTimeout 2s must not wait for the default
// ConnectTimeout, 30s).
func TestTimeLimitsWithABlackHole(t *testing.T) {
	start := time.Now()
	_, err := dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: "amqp://guest:guest@" + testenv.BlackHole(t) + "/", ConnectTimeout: 2 * time.Second}}, nil)
	testenv.WithinLimit(t, 2*time.Second, time.Since(start), "NewPublisher")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "gave up after 2s")
	assert.Contains(t, err.Error(), "AMQP handshake")

	env := testenv.New(t)
	p, proxy, q := proxiedPublisher(t, env, 2*time.Second, 0)
	hang(t, p, proxy)
	start = time.Now()
	err = p.Publish(q, message.NewMessage("black hole", nil))
	testenv.WithinLimit(t, 2*time.Second, time.Since(start), "Publish")
	require.Error(t, err)
	assert.Regexp(t, `dlx: publish to "`+q+`": gave up after 2s: dial: amqp://guest:xxxxx@127\.0\.0\.1:\d+/: AMQP handshake with 127\.0\.0\.1:`, err.Error())
}

// Four concurrent Publish calls that all need a connection, against a broker that never
// answers: each returns at its own limit (a dial that held the publisher's mutex would
// serialise them: 6, 9, 12 and 15 s).
func TestConcurrentPublishesKeepTheirLimits(t *testing.T) {
	env := testenv.New(t)
	p, proxy, q := proxiedPublisher(t, env, 2*time.Second, 2*time.Second)
	hang(t, p, proxy)

	var wg sync.WaitGroup
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			err := p.Publish(q, message.NewMessage("concurrent", nil))
			testenv.WithinLimit(t, 2*time.Second, time.Since(start), "Publish "+string(rune('A'+i)))
			if assert.Error(t, err) {
				assert.Contains(t, err.Error(), "gave up after 2s")
			}
		}()
	}
	wg.Wait()
}

// Publish honours the message's context: cancelled after 300 ms, Publish returns then, with
// that error, although PublishTimeout is 5 s.
func TestPublishHonoursTheMessageContext(t *testing.T) {
	env := testenv.New(t)
	p, proxy, q := proxiedPublisher(t, env, 5*time.Second, 5*time.Second)
	hang(t, p, proxy)

	ctx, cancel := context.WithCancel(context.Background())
	msg := message.NewMessage("cancelled", nil)
	msg.SetContext(ctx)
	start := time.Now() // before the cancel is set: it cannot come sooner than 300 ms after start
	time.AfterFunc(300*time.Millisecond, cancel)
	err := p.Publish(q, msg)
	elapsed := time.Since(start)
	assert.True(t, elapsed >= 300*time.Millisecond && elapsed < 600*time.Millisecond, "returned after %s", elapsed)
	require.ErrorIs(t, err, context.Canceled)

	// Of several messages, the first context that ends ends the call.
	start = time.Now()
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	other := message.NewMessage("other", nil)
	msg = message.NewMessage("deadline", nil)
	msg.SetContext(ctx)
	err = p.Publish(q, other, msg)
	elapsed = time.Since(start)
	assert.True(t, elapsed >= 300*time.Millisecond && elapsed < 600*time.Millisecond, "returned after %s", elapsed)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
