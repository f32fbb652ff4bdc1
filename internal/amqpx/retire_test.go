package amqpx_test

import (
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
)

// A retired Confirmer takes no more publishings, settles the one in flight on it (here a
// nack, from a queue that rejects every publish) rather than cutting it short, and then
// closes its channel.
func TestRetiredConfirmerClosesItsChannelOnceSettled(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.Queue("retired")
	_, err := env.Channel().QueueDeclare(q, true, false, false, false, amqp.Table{
		"x-max-length": int32(0), amqp.QueueOverflowArg: amqp.QueueOverflowRejectPublish,
	})
	require.NoError(t, err)
	conn, _, err := amqpx.Dial(t.Context(), env.Connection(), "retire test")
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	conf, err := amqpx.NewConfirmer(ch)
	require.NoError(t, err)

	f, err := conf.Publish(t.Context(), "", q, false, amqp.Publishing{Body: []byte("x")})
	require.NoError(t, err)
	conf.Retire()
	require.ErrorIs(t, f.Wait(t.Context()), amqpx.ErrNacked)
	_, err = conf.Publish(t.Context(), "", q, false, amqp.Publishing{Body: []byte("y")})
	require.ErrorIs(t, err, amqpx.ErrRetired)
	select {
	case <-conf.Done():
	case <-time.After(testenv.Patience()):
		t.Fatal("the retired channel is still open 10s after its last publishing was settled")
	}
	assert.True(t, ch.IsClosed())
	assert.False(t, conn.IsClosed(), "only the channel is closed")
}
