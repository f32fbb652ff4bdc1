package dlx_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// A publish the broker nacks until the time limit (here to a queue that rejects every
// publish; a quorum queue that is down is nacked alike) fails with ErrNacked, naming the
// queue and what a nack can mean: basic.nack carries no reason.
func TestNackedPublishSaysWhatItCanMean(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.Queue("nacked")
	_, err := env.Channel().QueueDeclare(q, true, false, false, false, amqp.Table{
		"x-max-length": int32(0), amqp.QueueOverflowArg: amqp.QueueOverflowRejectPublish,
	})
	require.NoError(t, err)
	pub, err := dlx.NewPublisher(dlx.Config{
		Connection:     env.Connection(),
		Topology:       topology.Config{Delay: env.Delay(topology.Delay{})},
		Route:          func(topic string) dlx.Route { return dlx.Route{RoutingKey: topic, Declared: true} },
		PublishTimeout: time.Second,
	}, env.Logger())
	require.NoError(t, err)
	defer pub.Close()
	err = pub.Publish(q, message.NewMessage(watermill.NewUUID(), []byte("x")))
	t.Logf("%v", err)
	require.ErrorIs(t, err, dlx.ErrNacked)
	assert.Contains(t, err.Error(), `queue "`+q+`"`)
	assert.Contains(t, err.Error(), "a nack gives no reason")
	assert.Contains(t, err.Error(), "may be down (a quorum queue without a leader")
}
