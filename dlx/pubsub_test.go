package dlx_test

import (
	"context"
	"testing"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// suiteDeliveryLimit is the delivery limit of the suites' quorum queues: Watermill's
// TestContinueAfterErrors nacks 300 times (with requeue) over 50 messages and expects them
// all back, while warren's default limit (20) rightly dead-letters a message returned that
// often into its poison queue.
const suiteDeliveryLimit = 1000

var pubsubFeatures = tests.Features{
	// The suite's volume tests (10,000 messages) run with warren's publisher and subscriber
	// in router's TestPubSubSuite; here, against watermill-amqp's subscriber, the short form
	// (100) checks the same behaviour in a fraction of the time.
	ForceShort:                          true,
	ConsumerGroups:                      true,
	ExactlyOnceDelivery:                 false,
	GuaranteedOrder:                     true,
	GuaranteedOrderWithSingleSubscriber: true,
	Persistent:                          true,
}

// Watermill's universal Pub/Sub suite with warren's publisher and a watermill-amqp
// subscriber that uses warren's marshaler and topology builder: queue per topic.
func TestPubSubSuiteQueues(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	tcfg := topology.Config{Delay: env.Delay(topology.Delay{}), DeliveryLimit: suiteDeliveryLimit}
	features := pubsubFeatures
	features.ConsumerGroups = false
	features.GenerateTopicFunc = func(tctx tests.TestContext) string { return env.Name(string(tctx.TestID)) }

	// Some tests derive further topics from the generated one: every queue is tracked
	// where it is named, so that all are removed.
	route := func(topic string) dlx.Route { return dlx.ToQueue(env.TrackQueue(topic)) }
	declareDelay(t, env, tcfg)
	tests.TestPubSub(t, features, func(t *testing.T) (message.Publisher, message.Subscriber) {
		pub, err := dlx.NewPublisher(dlx.Config{Connection: env.Connection(), Topology: tcfg, Route: route}, env.Logger())
		require.NoError(t, err)
		cfg := wamqp.NewDurableQueueConfig(env.URL)
		cfg.Queue.GenerateName = env.TrackQueue
		cfg.Marshaler = warren.Marshaler{}
		cfg.TopologyBuilder = mustBuilder(t, tcfg)
		sub, err := wamqp.NewSubscriber(cfg, env.Logger())
		require.NoError(t, err)
		return pub, sub
	}, nil)
}

// The same suite with an exchange per topic (fanout) and a queue per consumer group.
func TestPubSubSuiteConsumerGroups(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	tcfg := topology.Config{Delay: env.Delay(topology.Delay{}), ExchangeKind: topology.Fanout, DeliveryLimit: suiteDeliveryLimit}
	features := pubsubFeatures
	features.GenerateTopicFunc = func(tctx tests.TestContext) string { return env.Name(string(tctx.TestID)) }

	exchange := func(topic string) string { env.Remove(nil, []string{topic}); return topic }
	route := func(topic string) dlx.Route { return dlx.ExchangePerTopic(exchange(topic)) }
	newPubSub := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		pub, err := dlx.NewPublisher(dlx.Config{Connection: env.Connection(), Topology: tcfg, Route: route}, env.Logger())
		require.NoError(t, err)
		cfg := wamqp.NewDurablePubSubConfig(env.URL, func(topic string) string {
			return env.TrackQueue(topic + "_" + group)
		})
		cfg.Exchange.GenerateName = exchange
		cfg.Marshaler = warren.Marshaler{}
		cfg.TopologyBuilder = mustBuilder(t, tcfg)
		sub, err := wamqp.NewSubscriber(cfg, env.Logger())
		require.NoError(t, err)
		return pub, sub
	}
	declareDelay(t, env, tcfg)
	tests.TestPubSub(t, features, func(t *testing.T) (message.Publisher, message.Subscriber) {
		return newPubSub(t, "test")
	}, newPubSub)
}

// declareDelay declares the delay levels and the parking queue once, before the suite's
// parallel tests: a watermill-amqp Subscriber declares through BuildTopology on a channel it
// owns, so the Builder cannot retry there when the broker briefly reports a durable queue
// that another connection is creating as absent (see amqpx.IsPermanentBrokerError).
func declareDelay(t *testing.T, env *testenv.Env, cfg topology.Config) {
	var err error
	oneOfFewDeclaring(func() { err = mustBuilder(t, cfg).Apply(context.Background(), env.Connection(), topology.Topology{}) })
	require.NoError(t, err)
}

func mustBuilder(t *testing.T, cfg topology.Config) *topology.Builder {
	b, err := topology.NewBuilder(cfg, nil)
	require.NoError(t, err)
	return b
}
