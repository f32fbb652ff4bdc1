package ops

import (
	"context"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/testenv"
)

// A caller that spends longer than takeQuiet between two calls (a replay's commit on a loaded
// machine) still gets every message: the messages waiting in the channel meanwhile are not a
// quiet queue, although the broker counts none of them ready.
// (Not parallel: it shortens takeQuiet, which no other test may see.)
func TestTakeOutlastsASlowCaller(t *testing.T) {
	quiet := takeQuiet
	takeQuiet = 300 * time.Millisecond
	t.Cleanup(func() { takeQuiet = quiet })
	env := testenv.New(t)
	q := env.Queue("slow")
	ch := env.Channel()
	_, err := ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	require.NoError(t, err)
	const n = 300 // more than the taker's buffer
	for i := range n {
		require.NoError(t, ch.PublishWithContext(context.Background(), "", q, true, false, amqp.Publishing{MessageId: strconv.Itoa(i)}))
	}
	require.Eventually(t, func() bool { return env.Messages(q) == n }, testenv.Patience(), 10*time.Millisecond)

	tch := env.Channel()
	tk, err := take(context.Background(), tch, q, n)
	require.NoError(t, err)
	defer tk.close()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience())
	defer cancel()
	var ids []string
	for i := range n {
		if i%30 == 1 { // ten times
			time.Sleep(2 * takeQuiet)
		}
		d, ok, err := tk.next(ctx)
		require.NoError(t, err)
		if !ok {
			break
		}
		ids = append(ids, d.MessageId)
	}
	require.Len(t, ids, n, "the take ended early")
	for i, id := range ids {
		assert.Equal(t, strconv.Itoa(i), id)
	}
}
