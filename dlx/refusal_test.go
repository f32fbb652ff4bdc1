package dlx_test

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// A message too large for a frame is refused before anything is sent, at once and for good;
// the publisher's connection stays up for the messages around it (the broker would close it).
func TestTooLargeIsRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("big")
	p := newPublisher(t, env, func(c *dlx.Config) {
		c.PublishTimeout = 20 * time.Second
		// The default levels (8, not testenv.DelayLevels): the most digit headers, below.
		c.Topology.Delay = env.Delay(topology.Delay{Radix: topology.DefaultDelayRadix})
	})

	var wg sync.WaitGroup
	errs := make([]error, 50)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.Publish(q, message.NewMessage(strconv.Itoa(i), []byte("ok")))
		}()
	}
	big := message.NewMessage(watermill.NewUUID(), nil)
	big.Metadata.Set("blob", strings.Repeat("x", 128<<10))
	start := time.Now()
	err := p.Publish(q, big)
	require.ErrorIs(t, err, warren.ErrTooLarge)
	assert.True(t, warren.IsPermanent(err))
	assert.Less(t, time.Since(start), 5*time.Second, "refused at once, not retried until the limit")
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "message %d next to the large one", i)
	}
	require.NoError(t, p.Publish(q, message.NewMessage("after", nil)))
	assert.Len(t, consume(t, env, q, 51), 51)

	// A delayed one gets the digit headers on top: the limit counts them.
	justBelow := message.NewMessage(watermill.NewUUID(), nil)
	justBelow.Metadata.Set("blob", strings.Repeat("x", 120<<10))
	require.NoError(t, p.Publish(q, justBelow))
	warren.Delay(justBelow, time.Hour)
	assert.NoError(t, p.Publish(q, justBelow), "digit headers still fit")
}

// A broker refusal that closes the publisher's channel (here ACCESS_REFUSED on publish) is
// the refused message's error, returned at once; the messages in flight with it on the same
// channel are published.
//
// Not parallel: it starts a node of its own (a user without some permissions).
func TestRefusalIsPermanentForItsMessageOnly(t *testing.T) {
	node := testenv.StartNode(t)
	env := testenv.NewAt(t, node.URL())
	forbidden, allowed := env.Exchange("forbidden"), env.Queue("allowed")
	for _, args := range [][]string{
		{"add_user", "limited", "pw"},
		// configure and read everything; write everything but the forbidden exchange.
		{"set_permissions", "-p", "/", "limited", ".*", "^(?!" + forbidden + "$).*", ".*"},
	} {
		out, err := node.Ctl(args...)
		require.NoError(t, err, out)
	}
	require.NoError(t, env.Channel().ExchangeDeclare(forbidden, "topic", true, false, false, false, nil))
	url := strings.Replace(node.URL(), "guest:guest", "limited:pw", 1)
	p, err := dlx.NewPublisher(dlx.Config{
		Connection:     warren.Connection{URL: url},
		Topology:       topology.Config{Delay: env.Delay(topology.Delay{})},
		PublishTimeout: 20 * time.Second,
		Route: func(topic string) dlx.Route {
			if topic == forbidden { // declared below: the publish itself is refused
				return dlx.Route{Exchange: forbidden, RoutingKey: "k", Declared: true}
			}
			return dlx.ToQueue(topic)
		},
		AllowUnroutable: true,
	}, env.Logger())
	require.NoError(t, err)
	defer p.Close()

	stop := make(chan struct{})
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		published int
		failed    []error
	)
	halt := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer halt() // also when the test fails before the end
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				err := p.Publish(allowed, message.NewMessage(strconv.Itoa(g)+"-"+strconv.Itoa(i), nil))
				mu.Lock()
				if err != nil {
					failed = append(failed, err)
				} else {
					published++
				}
				mu.Unlock()
			}
		}()
	}
	// Innocent messages are in flight all the time: the refusals start once the 8 publishers
	// are under way (40 messages confirmed).
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return published >= 8*5
	}, testenv.Patience(), 5*time.Millisecond, "the innocent publishers publish nothing")
	for range 3 {
		start := time.Now()
		err := p.Publish(forbidden, message.NewMessage(watermill.NewUUID(), nil))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "ACCESS_REFUSED")
		assert.True(t, warren.IsPermanent(err), "%v", err)
		assert.Less(t, time.Since(start), 5*time.Second, "not retried until the limit of 20s")
	}
	halt()
	assert.Empty(t, failed, "messages in flight next to the refused ones")
	// A message in flight when the channel closed may have reached the queue before its retry.
	assert.GreaterOrEqual(t, env.Messages(allowed), published)
	t.Logf("queue holds %d", env.Messages(allowed))
	t.Logf("%d messages published next to 3 refused ones", published)
}
