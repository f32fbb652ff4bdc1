package router_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/consumer"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// Watermill's universal Pub/Sub suite with warren's publisher and subscriber: one message in
// flight (ordered, as the suite's ordering tests expect), and many. The volume tests (10,000
// messages) run with many in flight; with one, their short form (100) does.
func TestPubSubSuite(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		concurrency int
		ordered     bool
	}{"one in flight": {1, true}, "64 in flight": {64, false}} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := testenv.New(t)
			// Watermill's TestContinueAfterErrors nacks (with requeue) 300 times over 50
			// messages and expects them all back; warren's default delivery limit (20)
			// rightly dead-letters a message returned that often into its poison queue.
			tcfg := topology.Config{Delay: env.Delay(topology.Delay{}), DeliveryLimit: 1000}
			features := tests.Features{
				ForceShort:                          c.ordered,
				GuaranteedOrder:                     c.ordered,
				GuaranteedOrderWithSingleSubscriber: c.ordered,
				Persistent:                          true,
				GenerateTopicFunc:                   func(tctx tests.TestContext) string { return env.Name(string(tctx.TestID)) },
			}
			route := func(topic string) dlx.Route { return dlx.ToQueue(env.TrackQueue(topic)) }
			// The suite makes a publisher and a subscriber per test, each declaring its
			// quorum queues (delay levels included); run beside the package's other tests,
			// the broker took more than the default 30s to declare one of them.
			conn := env.Connection()
			conn.ConnectTimeout = 2 * testenv.Patience()
			tests.TestPubSub(t, features, func(t *testing.T) (message.Publisher, message.Subscriber) {
				pub, err := dlx.NewPublisher(dlx.Config{Connection: conn, Topology: tcfg, Route: route}, env.Logger())
				require.NoError(t, err)
				sub, err := consumer.NewSubscriber(consumer.Config{
					Connection: conn, Topology: tcfg, Concurrency: c.concurrency, Prefetch: c.concurrency,
					// The suite closes subscribers holding unacked messages and expects
					// their context to end within 15s: the wait for them is shorter.
					ShutdownTimeout: 2 * time.Second,
					// The suite nacks 300 times, one message in flight, and waits for each
					// to come back: warren's default pause before a requeue (1s, against hot
					// loops) made that test take 300s.
					RequeueDelay: 10 * time.Millisecond,
				}, env.Logger())
				require.NoError(t, err)
				return pub, sub
			}, nil)
		})
	}
}
