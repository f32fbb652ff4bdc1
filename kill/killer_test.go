package kill_test

import (
	"context"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/topology"
)

// confirmWait bounds the waits for confirmations in these tests: an upper bound, never
// asserted; without consumers nobody answers, and Send does not wait.
var confirmWait = testenv.Patience()

// killerOf returns a Killer of cfg on env's broker.
func killerOf(t *testing.T, env *testenv.Env, cfg kill.Config) *kill.Killer {
	t.Helper()
	cfg.Connection = env.Connection()
	k, err := kill.NewKiller(cfg, env.Logger())
	require.NoError(t, err)
	return k
}

// dial returns a connection to env's broker, closed when the test ends.
func dial(t *testing.T, env *testenv.Env) *amqp.Connection {
	t.Helper()
	conn, err := env.Dial()
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// A command for a queue that does not exist fails with ErrNoQueue and declares nothing (no
// kill exchange, state queue or lock is left behind); with Force it is sent, and
// remembered: the state holds it.
func TestKillOfAMissingQueueFailsAndDeclaresNothing(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("missing")
	env.Remove([]string{kill.LockQueue(queue)}, nil)
	exists := func(what string, declare func(ch *amqp.Channel) error) bool {
		t.Helper()
		err := declare(env.Channel()) // a channel each: a passive declare that fails closes it
		if err != nil {
			assert.ErrorContains(t, err, "NOT_FOUND", what)
		}
		return err == nil
	}
	leftovers := func() map[string]bool {
		return map[string]bool{
			"kill exchange": exists("kill exchange", func(ch *amqp.Channel) error {
				return ch.ExchangeDeclarePassive(topology.KillExchange(queue), amqp.ExchangeFanout, true, false, false, false, nil)
			}),
			"kill state queue": exists("kill state queue", func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclarePassive(kill.StateQueue(queue, nil), true, false, false, false, nil)
				return err
			}),
			"queue": exists("queue", func(ch *amqp.Channel) error {
				_, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
				return err
			}),
		}
	}

	k := killerOf(t, env, kill.Config{Wait: confirmWait})
	for _, action := range []kill.Action{kill.Stop, kill.Delete, kill.Resume} {
		res, err := k.Send(context.Background(), queue, action)
		require.ErrorIs(t, err, kill.ErrNoQueue, "%s", action)
		assert.ErrorContains(t, err, queue)
		assert.False(t, res.QueueExists)
		assert.False(t, res.Heard)
	}
	require.ErrorIs(t, k.Kill(context.Background(), queue, kill.Stop), kill.ErrNoQueue)
	require.ErrorIs(t, k.Resume(context.Background(), queue), kill.ErrNoQueue)
	assert.Equal(t, map[string]bool{"kill exchange": false, "kill state queue": false, "queue": false}, leftovers(),
		"declared for a queue that does not exist")

	forced := killerOf(t, env, kill.Config{Wait: confirmWait, Force: true})
	before := time.Now()
	res, err := forced.Send(context.Background(), queue, kill.Stop)
	require.ErrorIs(t, err, kill.ErrNoListener, "sent, and nobody listens")
	assert.False(t, res.QueueExists)
	assert.Equal(t, map[string]bool{"kill exchange": true, "kill state queue": true, "queue": false}, leftovers())
	c, found, err := kill.ReadState(context.Background(), dial(t, env), queue, nil)
	require.NoError(t, err)
	require.True(t, found, "the kill is remembered")
	assert.Equal(t, kill.Stop, c.Action)
	assert.False(t, c.At.Before(before.Truncate(time.Millisecond)), "the command remembered is the one sent")
}

// ReadState tells the last command sent, and leaves it where it was: read again, and by
// the consumers, it is the same. A command sent with a secret is in a state queue of its
// own, which ReadState reads only with that secret; without a state queue, nothing was
// ever sent.
func TestReadStateTellsTheLastCommandAndLeavesIt(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("state")
	const secret = "s3cret"
	env.Remove([]string{kill.StateQueue(queue, []byte(secret)), kill.LockQueue(queue)}, nil)
	conn := dial(t, env)
	read := func(secret string) (kill.Command, bool) {
		t.Helper()
		c, found, err := kill.ReadState(context.Background(), conn, queue, []byte(secret))
		require.NoError(t, err)
		return c, found
	}

	_, found := read("")
	assert.False(t, found, "never killed")
	k := killerOf(t, env, kill.Config{Force: true})
	require.ErrorIs(t, k.Kill(context.Background(), queue, kill.Stop), kill.ErrNoListener)
	stop, found := read("")
	require.True(t, found)
	assert.Equal(t, kill.Stop, stop.Action)
	again, found := read("")
	require.True(t, found, "the state is left as it was")
	assert.Equal(t, stop, again)
	// Reading puts the command back with a nack, which a quorum queue applies a moment later.
	assert.Eventually(t, func() bool {
		q, err := env.Inspect(kill.StateQueue(queue, nil))
		return err == nil && q.Messages == 1
	}, testenv.Patience(), 20*time.Millisecond, "the state holds one command")

	require.ErrorIs(t, k.Resume(context.Background(), queue), kill.ErrNoListener)
	resume, found := read("")
	require.True(t, found)
	assert.Equal(t, kill.Resume, resume.Action)
	assert.False(t, resume.At.Before(stop.At))

	_, found = read(secret)
	assert.False(t, found, "the secret's state queue was never written")
	signed := killerOf(t, env, kill.Config{Secret: []byte(secret), Force: true})
	require.ErrorIs(t, signed.Kill(context.Background(), queue, kill.Delete), kill.ErrNoListener)
	c, found := read(secret)
	require.True(t, found)
	assert.Equal(t, kill.Delete, c.Action)
	assert.NoError(t, c.Verify(queue, []byte(secret), time.Now(), 0, time.Minute), "signed with the secret")
	c, found = read("")
	require.True(t, found)
	assert.Equal(t, kill.Resume, c.Action, "the state without a secret is another queue")
}

// Every Kill returns within PublishTimeout against a broker that accepts TCP and never
// answers, from the start or once it has refused connections for a while, with an error
// that says so.
func TestKillTimeLimitWithABrokerThatNeverAnswers(t *testing.T) {
	// Not parallel with other tests (its cases are, with each other): it measures wall-clock limits.
	testenv.Slow(t)
	const limit = 2 * time.Second
	for _, broker := range []string{"black hole", "refusing, then black hole"} {
		t.Run(broker, func(t *testing.T) {
			t.Parallel()
			addr := testenv.BlackHole(t)
			if broker != "black hole" {
				addr = testenv.BlackHoleAfter(t, limit/2)
			}
			k, err := kill.NewKiller(kill.Config{Connection: warren.Connection{URL: "amqp://guest:guest@" + addr + "/"}, PublishTimeout: limit}, nil)
			require.NoError(t, err)
			start := time.Now()
			err = k.Kill(context.Background(), "q", kill.Stop)
			testenv.WithinLimit(t, limit, time.Since(start), "Killer.Kill")
			require.Error(t, err)
			assert.Contains(t, err.Error(), "gave up after 2s")
			assert.Contains(t, err.Error(), "AMQP handshake with "+addr)
		})
	}
}

// NewKiller names the first field of its Config that is not usable.
func TestNewKillerNamesTheInvalidField(t *testing.T) {
	conn := warren.Connection{URL: "amqp://guest:guest@127.0.0.1:5672/"}
	for field, cfg := range map[string]kill.Config{
		"kill: Config.Connection.URL is empty":       {},
		"kill: Config.Connection.ConnectTimeout -1s": {Connection: warren.Connection{URL: conn.URL, ConnectTimeout: -time.Second}, PublishTimeout: -time.Second},
		"kill: Config.PublishTimeout -1s":            {Connection: conn, PublishTimeout: -time.Second, Wait: -time.Second},
		"kill: Config.Wait -1s":                      {Connection: conn, Wait: -time.Second},
	} {
		_, err := kill.NewKiller(cfg, nil)
		if assert.Error(t, err, field) {
			assert.Contains(t, err.Error(), field)
		}
	}
	k, err := kill.NewKiller(kill.Config{Connection: conn}, nil)
	require.NoError(t, err)
	assert.ErrorContains(t, k.Kill(context.Background(), "q", kill.Resume), `action "resume" is neither "stop" nor "delete"`)
	_, err = k.Send(context.Background(), "q", "pause")
	assert.ErrorContains(t, err, `unknown action "pause"`)
}
