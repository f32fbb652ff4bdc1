package kill

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// answerTo returns a delivery of the answer a to the command of correlationID, signed with
// secret if there is one.
func answerTo(t *testing.T, correlationID string, a Answer, secret []byte) amqp.Delivery {
	t.Helper()
	if len(secret) > 0 {
		a.Sign(secret, correlationID)
	}
	body, err := json.Marshal(a)
	require.NoError(t, err)
	return amqp.Delivery{CorrelationId: correlationID, Body: body}
}

// With a secret, collect counts the confirmations signed with it and the refusals, one per
// consumer; it ignores what is malformed, for another command or queue, a consumer's second
// answer, an unknown state and an unsigned confirmation; and it stops once as many
// consumers as the queue had have answered, leaving what comes after unread.
func TestCollectCountsTheAnswersOfEachConsumerOnce(t *testing.T) {
	secret := []byte("s3cret")
	k := &Killer{cfg: Config{Secret: secret, Wait: time.Hour}, logger: watermill.NopLogger{}}
	const id = "c1"
	stopped := func(instance, process string) Answer {
		return Answer{Queue: "q", State: "stopped", Consuming: true, Process: process, Instance: instance}
	}
	replies := make(chan amqp.Delivery, 16)
	for _, d := range []amqp.Delivery{
		answerTo(t, id, stopped("i1", "p1"), secret),
		answerTo(t, id, stopped("i1", "p1"), secret),   // the same consumer again
		answerTo(t, "c0", stopped("i2", "p1"), secret), // another command's
		answerTo(t, id, Answer{Queue: "other", State: "stopped", Consuming: true, Instance: "i3"}, secret),
		answerTo(t, id, Answer{Queue: "q", State: "paused", Consuming: true, Instance: "i4"}, secret),
		{CorrelationId: id, Body: []byte("{")},    // malformed
		answerTo(t, id, stopped("i5", "p2"), nil), // a confirmation not signed
		answerTo(t, id, Answer{Queue: "q", State: "refused", Consuming: true, Error: "wrong signature"}, nil),
		answerTo(t, id, stopped("i6", "p1"), secret), // the third consumer: the last counted
		answerTo(t, id, stopped("i7", "p3"), secret), // after the count: left unread
	} {
		replies <- d
	}
	res := Result{Queue: "q", Action: Stop, Heard: true, QueueConsumers: 3, States: map[string]int{}}
	k.collect(context.Background(), &sent{replies: replies, correlationID: id, at: time.Now()}, &res)

	assert.Equal(t, 2, res.Consumers)
	assert.Equal(t, 1, res.Processes)
	assert.Equal(t, map[string]int{"stopped": 2}, res.States)
	assert.Equal(t, 1, res.Refused)
	assert.Equal(t, 6, res.Ignored)
	require.Len(t, res.Answers, 3)
	assert.Equal(t, []string{"i1", "", "i6"}, []string{res.Answers[0].Instance, res.Answers[1].Instance, res.Answers[2].Instance})
	assert.Len(t, replies, 1, "an answer read after as many as the queue had consumers")
	assert.False(t, res.Confirmed(), "a consumer refused it")
}

// Without a secret, an unsigned confirmation counts; when the queue had no consumer to count
// by (stopped ones have none), collect takes every answer until Wait is over.
func TestCollectWithoutASecretCountsUnsignedAnswersUntilWaitIsOver(t *testing.T) {
	k := &Killer{cfg: Config{Wait: 50 * time.Millisecond}, logger: watermill.NopLogger{}}
	const id = "c1"
	replies := make(chan amqp.Delivery, 4)
	for _, instance := range []string{"i1", "i2", "i3"} {
		replies <- answerTo(t, id, Answer{Queue: "q", State: "resumed", Process: "p-" + instance, Instance: instance}, nil)
	}
	res := Result{Queue: "q", Action: Resume, Heard: true, States: map[string]int{}}
	k.collect(context.Background(), &sent{replies: replies, correlationID: id, at: time.Now()}, &res)

	assert.Equal(t, 3, res.Consumers)
	assert.Equal(t, 3, res.Processes)
	assert.Equal(t, map[string]int{"resumed": 3}, res.States)
	assert.Zero(t, res.Ignored)
	assert.True(t, res.Confirmed())
}

// Stopped consumers have no consumer on the queue, but the broker counts them as listeners:
// collect stops once as many as listened have answered (a refusal is an answer too),
// leaving what comes after unread; it does not wait for Wait or the end of ctx.
func TestCollectStopsOnceEveryListenerAnswered(t *testing.T) {
	k := &Killer{cfg: Config{Wait: time.Hour}, logger: watermill.NopLogger{}}
	const id = "c1"
	replies := make(chan amqp.Delivery, 4)
	for _, instance := range []string{"i1", "i2"} {
		replies <- answerTo(t, id, Answer{Queue: "q", State: "resumed", Process: "p1", Instance: instance}, nil)
	}
	replies <- answerTo(t, id, Answer{Queue: "q", State: "refused", Error: "wrong signature"}, nil)
	replies <- answerTo(t, id, Answer{Queue: "q", State: "resumed", Process: "p1", Instance: "i4"}, nil)
	res := Result{Queue: "q", Action: Resume, Heard: true, Listeners: 3, States: map[string]int{}}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	k.collect(ctx, &sent{replies: replies, correlationID: id, at: time.Now()}, &res)

	assert.NoError(t, ctx.Err(), "collect waited until the context ended")
	assert.Len(t, res.Answers, 3)
	assert.Equal(t, 2, res.Consumers)
	assert.Equal(t, 1, res.Refused)
	assert.Len(t, replies, 1, "an answer read after as many as listened")
	assert.False(t, res.Confirmed(), "a consumer refused it")

	res.Refused, res.Consumers = 0, 3
	assert.True(t, res.Confirmed(), "every listener confirmed")
	res.Consumers = 2
	assert.False(t, res.Confirmed(), "a listener did not confirm")
}
