package dlx_test

import (
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// Publishers made on one shared connection (a router's publishing connection) publish on it,
// each on a channel of its own, with their own routes: one connection for all of them, kept
// open when one of them closes, and opened again once when it is lost.
func TestPublishersShareAConnection(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	proxy, url := testenv.ProxyURL(t, env.URL)
	var connected atomic.Int32
	conn := warren.Connection{URL: url, OnEvent: func(e warren.ConnectionEvent) {
		if e.State != warren.Reconnecting {
			connected.Add(1)
		}
	}}
	c := amqpx.NewConn(amqpx.NewDialer(conn, "warren test", nil))
	defer c.Close()
	cfg := dlx.Config{Connection: conn, Topology: topology.Config{Delay: env.Delay(topology.Delay{})}}
	var first *dlx.Publisher
	var err error
	oneOfFewDeclaring(func() { first, err = dlx.NewPublisherOn(c, cfg, true, env.Logger()) })
	require.NoError(t, err)
	q, x := env.Queue("direct"), env.Exchange("events")
	cfg.Route = dlx.ToExchange(x)
	second, err := dlx.NewPublisherOn(c, cfg, false, env.Logger())
	require.NoError(t, err)
	bound := env.Queue("bound")
	ch := env.Channel()
	require.NoError(t, ch.ExchangeDeclare(x, "topic", true, false, false, false, nil))
	_, err = ch.QueueDeclare(bound, true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(bound, "#", x, false, nil))

	require.NoError(t, first.Publish(q, message.NewMessage("to-queue", nil)))
	require.NoError(t, second.Publish("order.created", message.NewMessage("to-exchange", nil)))
	assert.Equal(t, "to-queue", consume(t, env, q, 1)[0].msg.UUID)
	assert.Equal(t, "to-exchange", consume(t, env, bound, 1)[0].msg.UUID)
	assert.EqualValues(t, 1, connected.Load(), "connections opened")

	require.NoError(t, first.Close())
	require.NoError(t, second.Publish("order.created", message.NewMessage("after-close", nil)), "the other one's Close left the connection open")
	assert.Equal(t, "after-close", consume(t, env, bound, 1)[0].msg.UUID)
	err = first.Publish(q, message.NewMessage("closed", nil))
	assert.ErrorIs(t, err, warren.ErrClosed)

	proxy.Drop()
	require.NoError(t, second.Publish("order.created", message.NewMessage("after-loss", nil)))
	assert.Equal(t, "after-loss", consume(t, env, bound, 1)[0].msg.UUID)
	assert.EqualValues(t, 2, connected.Load(), "connections opened: the lost one once more")
	require.NoError(t, second.Close())
	assert.NotNil(t, c.Current(), "the publishers do not close the shared connection")
}
