package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
)

// hostile clears the screen, sets the window title, rings the bell, and has NUL, DEL and the
// C1 CSI (U+009B): valid UTF-8, so that JSON can carry it exactly.
const hostile = "\x1b[2J\x1b]0;pwned\x07\x00\x7f\u009b31m<end>"

// hostileShown is hostile as the CLI shows it.
const hostileShown = `\x1b[2J\x1b]0;pwned\x07\x00\u007f\u009b31m<end>`

// assertSafe fails unless out is valid UTF-8 without a control character but newline and tab.
func assertSafe(t *testing.T, out, what string) {
	t.Helper()
	assert.True(t, utf8.ValidString(out), "%s: not UTF-8: %q", what, out)
	for _, r := range out {
		if r < 0x20 && r != '\n' && r != '\t' || r >= 0x7f && r <= 0x9f {
			t.Errorf("%s: control character %U in %q", what, r, out)
			return
		}
	}
}

// Hostile values reach the terminal escaped, on a throwaway node of the test's own (hostile
// input never goes to a shared broker).
func TestHostileOutput(t *testing.T) {
	t.Parallel()
	node := testenv.StartNode(t)
	t.Run("values", func(t *testing.T) { t.Parallel(); hostileValuesAreShownEscaped(t, node.URL()) })
	t.Run("kill answer", func(t *testing.T) { t.Parallel(); hostileKillAnswerIsShownEscaped(t, node.URL()) })
}

// Hostile ids, error texts, handler names, headers and destinations reach the terminal
// escaped through every command that prints them, and exact through --json and export.
func hostileValuesAreShownEscaped(t *testing.T, url string) {
	env := testenv.NewAt(t, url)
	q := env.Queue("hostile")
	msg := message.NewMessage(hostile, []byte("body"))
	msg.Metadata.Set(warren.PoisonErrorKey, hostile+" and bad UTF-8: \xff")
	msg.Metadata.Set(warren.PoisonHandlerKey, hostile)
	msg.Metadata.Set(warren.PoisonTraceIDKey, hostile)
	msg.Metadata.Set("tenant", hostile)
	poisonQueue(t, env, q, msg)

	text := func(args ...string) string {
		t.Helper()
		stdout, stderr, _ := runCode(t, env.URL, args...)
		assertSafe(t, stdout+stderr, strings.Join(args[:2], " "))
		t.Log("\n" + stdout + stderr)
		return stdout + stderr
	}
	assert.Contains(t, text("poison", "list", q), hostileShown[:36])
	assert.Contains(t, text("poison", "list", q, "--group"), hostileShown)
	assert.Contains(t, text("poison", "list", env.Name(hostile)), `\x1b[2J`) // an error naming it
	assert.Contains(t, text("status", env.Name(hostile)), `\x1b[2J`)

	for _, args := range [][]string{{"poison", "list", q, "--json"}, {"poison", "export", q}} {
		stdout := text(args...)
		var m ops.Message
		if args[1] == "list" {
			var ms []ops.Message
			require.NoError(t, json.Unmarshal([]byte(stdout), &ms), stdout)
			require.Len(t, ms, 1)
			m = ms[0]
		} else {
			require.NoError(t, json.Unmarshal([]byte(stdout), &m), stdout)
		}
		assert.Equal(t, hostile, m.ID, "%v", args)
		assert.Equal(t, hostile, m.Handler, "%v", args)
		assert.Equal(t, hostile, m.TraceID, "%v", args)
		assert.Equal(t, hostile, m.Headers["tenant"], "%v", args)
		assert.Equal(t, hostile+" and bad UTF-8: \ufffd", m.Error, "%v: JSON holds no invalid UTF-8", args)
	}

	// Parked: a delayed message whose destination (a header) is hostile.
	delay := cliDelay(env)
	delayFlags := []string{"--prefix", delay.Prefix, "--levels", fmt.Sprint(delay.Levels)}
	ch := env.Channel()
	_, err := ch.QueueDeclare(delay.ParkingQueue(), true, false, false, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.PublishWithContext(context.Background(), "", delay.ParkingQueue(), true, false, amqp.Publishing{
		MessageId: hostile, ContentType: hostile, Headers: amqp.Table{contract.DestQueueHeader: hostile}}))
	require.Eventually(t, func() bool { return env.Messages(delay.ParkingQueue()) == 1 }, testenv.Patience(), 10*time.Millisecond)
	out := text(append([]string{"parked", "list"}, delayFlags...)...)
	assert.Contains(t, out, hostileShown[:36])
	assert.Contains(t, out, hostileShown)
	assert.Contains(t, text(append([]string{"parked", "replay"}, delayFlags...)...), "queue "+hostileShown+" does not exist")
}

// A refusal of a kill command carries the consumer's reason, which anyone who can publish
// to the reply queue can forge: it is shown escaped, and exact in --json.
func hostileKillAnswerIsShownEscaped(t *testing.T, url string) {
	env := testenv.NewAt(t, url)
	q := env.Queue("hostilekill")
	poisonQueue(t, env, q) // the work queue and its kill exchange
	ch := env.Channel()
	eaves, err := ch.QueueDeclare("", false, true, true, false, nil)
	require.NoError(t, err)
	require.NoError(t, ch.QueueBind(eaves.Name, "", topology.KillExchange(q), false, nil))
	commands, err := ch.Consume(eaves.Name, "", true, true, false, false, nil)
	require.NoError(t, err)
	_, err = ch.Consume(q, "", false, false, false, false, nil) // the queue has a consumer: one answer ends the wait
	require.NoError(t, err)
	go func() {
		for d := range commands {
			body, _ := json.Marshal(kill.Answer{Queue: q, State: "refused", Consuming: true, Error: hostile})
			_ = ch.PublishWithContext(context.Background(), "", d.ReplyTo, false, false, amqp.Publishing{CorrelationId: d.CorrelationId, Body: body})
		}
	}()

	stdout, stderr, code := runCode(t, env.URL, "kill", q, "--wait", waitFor)
	assert.Equal(t, 3, code, stderr)
	assertSafe(t, stdout+stderr, "kill")
	assert.Contains(t, stdout, "refused stop: "+hostileShown)

	stdout, stderr, code = runCode(t, env.URL, "resume", q, "--wait", waitFor, "--json")
	assert.Equal(t, 3, code, stderr)
	assertSafe(t, stdout+stderr, "resume --json")
	var res kill.Result
	require.NoError(t, json.Unmarshal([]byte(stdout), &res), stdout)
	require.Len(t, res.Answers, 1)
	assert.Equal(t, hostile, res.Answers[0].Error)
}
