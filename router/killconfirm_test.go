package router_test

import (
	"context"
	"encoding/json"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/topology"
)

// confirmWait bounds the waits for confirmations in these tests: an upper bound, never
// asserted; a wait ends early once as many consumers as the queue had have answered.
var confirmWait = testenv.Patience()

// A kill reaches 2 consumer processes of 2 consumers each: Send reports 4
// consumers in 2 processes confirmed, as many as the queue had; the answers name the
// processes. Resume (the stopped consumers have no consumer on the queue to count) and
// delete are confirmed too.
func TestKillIsConfirmedByEveryConsumerInEveryProcess(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("confirmed")
	f := newFleet(t, env, queue, env.Delay(topology.Delay{}).Prefix, "")
	f.start(2, 2)
	consumers := func(n int) {
		t.Helper()
		require.Eventually(t, func() bool { q, err := env.Inspect(queue); return err == nil && q.Consumers == n },
			testenv.Patience(), 5*time.Millisecond, "the queue does not have %d consumers", n)
	}
	consumers(4)
	k := killerOf(t, env, kill.Config{Wait: confirmWait})

	since := time.Now()
	res, err := k.Send(context.Background(), queue, kill.Stop)
	require.NoError(t, err)
	t.Logf("stop confirmed by %d consumers in %d processes after %s", res.Consumers, res.Processes, res.Waited)
	assert.True(t, res.QueueExists)
	assert.Equal(t, 4, res.QueueConsumers)
	assert.Equal(t, 4, res.Consumers)
	assert.Equal(t, 2, res.Processes)
	assert.Equal(t, map[string]int{"stopped": 4}, res.States)
	assert.Zero(t, res.Refused)
	assert.Zero(t, res.Ignored)
	assert.True(t, res.Confirmed())
	pids, handlers := map[int]bool{}, map[string]bool{}
	for _, a := range res.Answers {
		assert.True(t, a.Consuming)
		assert.NotEqual(t, os.Getpid(), a.PID, "answered by a consumer process")
		assert.NotEmpty(t, a.Host)
		pids[a.PID], handlers[a.Handler] = true, true
	}
	assert.Len(t, pids, 2)
	assert.Len(t, handlers, 4)
	f.awaitHandlers("stopped", 4, since, testenv.Patience())
	consumers(0)

	res, err = killerOf(t, env, kill.Config{Wait: 3 * time.Second}).Send(context.Background(), queue, kill.Resume)
	require.NoError(t, err)
	assert.Zero(t, res.QueueConsumers, "stopped consumers have no consumer on the queue")
	assert.Equal(t, map[string]int{"resumed": 4}, res.States)
	assert.Equal(t, 2, res.Processes)
	assert.True(t, res.Confirmed())
	for _, a := range res.Answers {
		assert.False(t, a.Consuming)
	}

	consumers(4)
	res, err = k.Send(context.Background(), queue, kill.Delete)
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"draining": 4}, res.States)
	assert.True(t, res.Confirmed())
	f.awaitHandlers("deleted", 4, since, testenv.Patience())
}

// A command to a stopped queue returns once every consumer has answered, before its wait
// is over: the stopped consumers have no consumer on the queue to count them by, but each
// listening subscription holds a consumer on the kill listener queue, which the Killer
// counts. Kill's Wait is longer than the test's context: a Send that waited for the
// answers that never come returns only when the context ends.
func TestCommandToAStoppedQueueReturnsOnceEveryListenerAnswered(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("stopped-answers")
	const n = 3
	probes := make([]*probe, n)
	for i := range probes {
		probes[i] = startProbe(t, env, queue, "")
	}
	k := killerOf(t, env, kill.Config{Wait: time.Hour})
	send := func(action kill.Action) kill.Result {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), confirmWait)
		defer cancel()
		res, err := k.Send(ctx, queue, action)
		require.NoError(t, err)
		assert.NoError(t, ctx.Err(), "%s waited until the context ended", action)
		assert.Equal(t, n, res.Listeners, action)
		assert.Len(t, res.Answers, n, action)
		assert.True(t, res.Confirmed(), action)
		return res
	}

	res := send(kill.Stop)
	assert.Equal(t, n, res.QueueConsumers)
	assert.Equal(t, map[string]int{"stopped": n}, res.States)
	for _, p := range probes {
		p.await(t, "stopped")
	}
	res = send(kill.Stop) // again, to stopped consumers
	assert.Zero(t, res.QueueConsumers, "stopped consumers have no consumer on the queue")
	assert.Equal(t, map[string]int{"stopped": n}, res.States)
	res = send(kill.Resume)
	assert.Zero(t, res.QueueConsumers, "stopped consumers have no consumer on the queue")
	assert.Equal(t, map[string]int{"resumed": n}, res.States)
	for _, a := range res.Answers {
		assert.False(t, a.Consuming)
	}
}

// The kill listener queue counts the listening subscriptions and nothing else: it takes no
// message, and it is gone once nobody listens.
func TestKillListenerQueueTakesNothingAndGoesWithTheLastListener(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("listener-queue")
	p := startProbe(t, env, queue, "")
	listeners := kill.ListenerQueue(queue)
	q, err := env.Inspect(listeners)
	require.NoError(t, err)
	assert.Equal(t, 1, q.Consumers)

	err = amqpx.PublishConfirmed(context.Background(), env.Channel(), "", listeners, true, amqp.Publishing{Body: []byte("x")})
	assert.ErrorIs(t, err, amqpx.ErrNacked, "the listener queue took a message")

	require.NoError(t, p.r.Close())
	require.Eventually(t, func() bool {
		_, err := env.Inspect(listeners)
		return amqpx.IsNotFound(err)
	}, testenv.Patience(), 10*time.Millisecond, "the listener queue outlived its last listener")
}

// With a secret, a command signed with another secret, or not signed, is refused,
// and each refusal is counted (without the consumer's identity: the reply address is not
// signed either); the right secret is confirmed. A confirmation that is not signed with the
// secret (forged by whoever saw the reply address go past) is ignored, and a copy of the
// command redirected to another reply queue is not answered.
func TestKillRefusalsAreCountedAndForgeriesIgnored(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	queue := env.Queue("refusing")
	const secret = "s3cret"
	for _, s := range []string{secret, "not the secret"} {
		env.Remove([]string{kill.StateQueue(queue, []byte(s))}, nil)
	}
	p := startProbe(t, env, queue, secret)
	consuming(t, env, queue)

	for secret, why := range map[string]string{"not the secret": "wrong signature", "": "unsigned command"} {
		res, err := killerOf(t, env, kill.Config{Secret: []byte(secret), Wait: confirmWait}).
			Send(context.Background(), queue, kill.Stop)
		require.NoError(t, err)
		assert.Equal(t, 1, res.Refused, why)
		assert.Zero(t, res.Consumers, why)
		assert.False(t, res.Confirmed(), why)
		require.Len(t, res.Answers, 1, why)
		a := res.Answers[0]
		assert.Equal(t, "refused", a.State)
		assert.Contains(t, a.Error, why)
		assert.True(t, a.Consuming)
		assert.Empty(t, a.Host+a.Handler+a.Instance, "identity told to an unsigned reply address")
	}
	assert.NotContains(t, p.states(), "stopped")

	k := killerOf(t, env, kill.Config{Secret: []byte(secret), Wait: confirmWait})
	res, err := k.Send(context.Background(), queue, kill.Stop)
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"stopped": 1}, res.States)
	assert.Zero(t, res.Refused)
	assert.True(t, res.Confirmed())
	require.Len(t, res.Answers, 1)
	host, _ := os.Hostname()
	assert.Equal(t, host, res.Answers[0].Host)
	assert.Equal(t, os.Getpid(), res.Answers[0].PID)
	assert.NotEmpty(t, res.Answers[0].Sig)

	// A forger sees the resume go past: it answers in the consumer's stead, unsigned, and
	// sends a copy of the command that asks for answers in a queue of its own.
	captured := eavesdrop(t, env, queue)
	ch := env.Channel()
	own, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	forged := make(chan error, 1)
	go func() {
		select {
		case d := <-captured:
			forgery, _ := json.Marshal(kill.Answer{Queue: queue, State: "resumed", Consuming: true, Instance: "forged"})
			err := ch.PublishWithContext(context.Background(), "", d.ReplyTo, false, false,
				amqp.Publishing{CorrelationId: d.CorrelationId, Body: forgery})
			if err == nil {
				err = ch.PublishWithContext(context.Background(), topology.KillExchange(queue), "", false, false,
					amqp.Publishing{ReplyTo: own.Name, CorrelationId: d.CorrelationId, Body: d.Body})
			}
			forged <- err
		case <-time.After(confirmWait):
			forged <- assert.AnError
		}
	}()
	// A listener that never answers keeps the Send waiting all of Wait, so that the forged
	// answer comes within it, however late the machine lets the forger be.
	_, err = env.Channel().Consume(kill.ListenerQueue(queue), "", true, false, false, false, nil)
	require.NoError(t, err)
	res, err = killerOf(t, env, kill.Config{Secret: []byte(secret), Wait: 5 * time.Second}).
		Send(context.Background(), queue, kill.Resume)
	require.NoError(t, err)
	require.NoError(t, <-forged)
	assert.Equal(t, map[string]int{"resumed": 1}, res.States, "the forged confirmation counted")
	assert.Equal(t, 1, res.Ignored)
	for _, a := range res.Answers {
		assert.NotEqual(t, "forged", a.Instance)
	}
	// The copy came after the command: the consumer does not answer it.
	assert.Never(t, func() bool { q, err := env.Inspect(own.Name); return err != nil || q.Messages > 0 },
		time.Second, 20*time.Millisecond, "a redirected command was answered")
}

// A command a consumer reads from the kill state queue when it starts is never
// answered, even one that carries a reply address; the live command that follows is.
func TestKillStateReplayIsNotAnswered(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("replayed-no-answer")
	k := killerOf(t, env, kill.Config{Force: true, Wait: confirmWait})
	_, err := k.Send(context.Background(), queue, kill.Stop)
	require.ErrorIs(t, err, kill.ErrNoListener)

	// Give the remembered stop a reply address, as if a Killer had put it there.
	ch := env.Channel()
	reply, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	state := kill.StateQueue(queue, nil)
	d, ok, err := ch.Get(state, false)
	require.NoError(t, err)
	require.True(t, ok, "the stop is remembered")
	assert.Empty(t, d.ReplyTo, "the state's copy of a command carries no reply address")
	require.NoError(t, amqpx.PublishConfirmed(context.Background(), ch, "", state, true, amqp.Publishing{
		ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: d.Body,
		ReplyTo: reply.Name, CorrelationId: "replayed",
	}))
	require.NoError(t, d.Ack(false))

	p := startProbe(t, env, queue, "")
	p.await(t, "stopped")
	res, err := killerOf(t, env, kill.Config{Wait: 3 * time.Second}).Send(context.Background(), queue, kill.Resume)
	require.NoError(t, err)
	assert.Equal(t, map[string]int{"resumed": 1}, res.States, "the live command is answered")
	q, err := env.Inspect(reply.Name)
	require.NoError(t, err)
	assert.Zero(t, q.Messages, "the command read from the state at startup was answered")
}
