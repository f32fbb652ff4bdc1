package kill_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/kill"
)

// ReadState does not read while a command of the state is out: got by a reader and not yet
// returned, as between a reader's lost connection (its lock released at once) and the
// return of what it held. A channel of the test's, which took no lock, holds the newest
// command, a resume, while the stop before it is back in the queue: ReadState ends with an
// error once its context does, rather than tell the stop, and tells the resume once it is
// back.
func TestReadStateWaitsForACommandThatIsOut(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("out")
	state := kill.StateQueue(queue, nil)
	conn := dial(t, env)
	k := killerOf(t, env, kill.Config{Force: true})
	hold := func(want kill.Action) *amqp.Channel {
		t.Helper()
		ch := env.Channel()
		d, ok, err := ch.Get(state, false)
		require.NoError(t, err)
		require.True(t, ok, "the state holds a command")
		var c kill.Command
		require.NoError(t, json.Unmarshal(d.Body, &c))
		require.Equal(t, want, c.Action)
		return ch
	}
	// inQueue waits until the state holds ready commands, and out ones (a quorum queue
	// counts each as a consumer).
	inQueue := func(ready, out int) {
		t.Helper()
		require.Eventually(t, func() bool {
			q, err := env.Inspect(state)
			return err == nil && q.Messages == ready && q.Consumers == out
		}, testenv.Patience(), 5*time.Millisecond, "the state holds %d command(s), %d out", ready, out)
	}

	require.ErrorIs(t, k.Kill(context.Background(), queue, kill.Stop), kill.ErrNoListener)
	begin := time.Now()
	c, found, err := kill.ReadState(context.Background(), conn, queue, nil) // while nothing is out: its time is the measure below
	oneRead := time.Since(begin)
	require.NoError(t, err)
	require.True(t, found)
	require.Equal(t, kill.Stop, c.Action)
	inQueue(1, 0) // ReadState's nack is applied a moment later
	older := hold(kill.Stop)
	require.ErrorIs(t, k.Resume(context.Background(), queue), kill.ErrNoListener) // the purge leaves the stop, out
	newest := hold(kill.Resume)
	require.NoError(t, older.Close())
	inQueue(1, 1) // the stop is back; the resume is out

	// ReadState without the wait reads the stop in one read; with it, it is given many
	// times that (never under a second) and ends with its context.
	ctx, cancel := context.WithTimeout(context.Background(), max(time.Second, 20*oneRead))
	c, found, err = kill.ReadState(ctx, conn, queue, nil)
	cancel()
	assert.ErrorIs(t, err, context.DeadlineExceeded, "found %v: %s", found, c.Action)

	require.NoError(t, newest.Close())
	c, found, err = kill.ReadState(context.Background(), conn, queue, nil)
	require.NoError(t, err)
	require.True(t, found)
	assert.Equal(t, kill.Resume, c.Action, "the newest command, once back")
}

// The tests' cleanup (testenv.WorkQueueNames) names the kill state queue that a work queue's
// kill without a secret leaves.
func TestCleanupNamesTheStateQueue(t *testing.T) {
	queues, _ := testenv.WorkQueueNames("orders")
	assert.Contains(t, queues, kill.StateQueue("orders", nil))
}
