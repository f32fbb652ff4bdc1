package router_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// attempts records the attempt number of every call, per stage and message.
type attempts struct {
	mu   sync.Mutex
	seen map[string][]int
}

func (a *attempts) add(stage string, msg *message.Message) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.seen == nil {
		a.seen = map[string][]int{}
	}
	k := stage + "/" + msg.UUID
	a.seen[k] = append(a.seen[k], middleware.Attempt(msg))
	return len(a.seen[k])
}

func (a *attempts) get(stage, id string) []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]int(nil), a.seen[stage+"/"+id]...)
}

// A message forwarded as received (msg.Copy()) after its last attempt starts at attempt 1 in
// the next queue, whichever way it is forwarded: returned with HandlerConfig.PublishTopic,
// published by hand through Router.Publisher(), or through a plain dlx.Publisher (the
// subscriber believes attempt bookkeeping only on a retry of the queue it consumes). Every
// stage of A → B → C fails twice, then forwards: each sees attempts 1, 2, 3, and nothing is
// poisoned.
func TestForwardedMessageStartsAtAttemptOne(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"returned", "router publisher", "plain publisher"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			env := testenv.Logic(t)
			stages := []string{env.Queue("a"), env.Queue("b"), env.Queue("c")}
			r := newRouter(t, env, func(c *router.Config) {
				c.Retry = middleware.BackoffConfig{Delays: []time.Duration{10 * time.Millisecond}, MaxAttempts: 3}
			})
			plain := newPublisherFor(t, env)
			var seen attempts
			done := make(chan string, 16)
			for i, queue := range stages {
				next := ""
				if i+1 < len(stages) {
					next = stages[i+1]
				}
				h := router.HandlerConfig{Queue: queue}
				if how == "returned" {
					h.PublishTopic = next
				}
				require.NoError(t, r.AddHandler(h, func(msg *message.Message) ([]*message.Message, error) {
					if seen.add(queue, msg) < 3 {
						return nil, errors.New("fails twice")
					}
					if next == "" {
						done <- msg.UUID
						return nil, nil
					}
					fwd := msg.Copy() // forwarded as received
					switch how {
					case "returned":
						return []*message.Message{fwd}, nil
					case "router publisher":
						return nil, r.Publisher().Publish(next, fwd)
					default:
						return nil, plain.Publish(next, fwd)
					}
				}))
			}
			start(t, r)
			ids := []string{"m1", "m2", "m3"}
			for _, id := range ids {
				require.NoError(t, plain.Publish(stages[0], message.NewMessage(id, []byte(id))))
			}
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			timeout := time.After(testenv.Patience())
			for finished := 0; finished < len(ids); {
				select {
				case <-done:
					finished++
				case <-tick.C:
					for _, q := range stages {
						require.Zero(t, env.Messages(topology.PoisonQueue(q)), "poisoned at stage %s", q)
					}
				case <-timeout:
					t.Fatalf("%d of %d messages went through the pipeline", finished, len(ids))
				}
			}
			for _, q := range stages {
				for _, id := range ids {
					assert.Equal(t, []int{1, 2, 3}, seen.get(q, id), "%s at stage %s", id, q)
				}
				assert.Zero(t, env.Messages(topology.PoisonQueue(q)), "poisoned at stage %s", q)
			}
		})
	}
}

// What a handler sends on after its third attempt, a copy of the message it got, returned
// (HandlerConfig.PublishTopic) or published through Router.Publisher(), carries the
// message's own headers and none of the delivery's bookkeeping.
func TestOutputsCarryNoBookkeeping(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue, returned, published := env.Queue("in"), env.Queue("returned"), env.Queue("published")
	r := newRouter(t, env, func(c *router.Config) {
		c.Retry = middleware.BackoffConfig{Delays: []time.Duration{10 * time.Millisecond}, MaxAttempts: 3}
		c.Declare.Queues = []topology.Queue{{Name: returned}, {Name: published}}
	})
	var seen attempts
	require.NoError(t, r.AddHandler(router.HandlerConfig{Queue: queue, PublishTopic: returned},
		func(msg *message.Message) ([]*message.Message, error) {
			if seen.add(queue, msg) < 3 {
				return nil, errors.New("fails twice")
			}
			if err := r.Publisher().Publish(published, msg.Copy()); err != nil {
				return nil, err
			}
			return []*message.Message{msg.Copy()}, nil
		}))
	start(t, r)
	publishRaw(t, env, "", queue, amqp.Publishing{MessageId: "m", Headers: amqp.Table{"tenant": "t1"}})
	for _, q := range []string{returned, published} {
		var got []amqp.Delivery
		require.Eventually(t, func() bool {
			got = append(got, drain(t, env, q)...)
			return len(got) > 0
		}, testenv.Patience(), 20*time.Millisecond, q)
		assert.Equal(t, "m", got[0].MessageId, q)
		assert.Equal(t, "t1", got[0].Headers["tenant"], "%s: the message's own headers are kept", q)
		assert.Empty(t, bookkeeping(got[0].Headers), q)
	}
	assert.Equal(t, []int{1, 2, 3}, seen.get(queue, "m"))
}

// A reply (here the request forwarded as received, after two failures) carries none of the
// request's bookkeeping; an error reply carries the request's poison record, which the caller
// reads, and none of the rest.
func TestReplyCarriesNoBookkeeping(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue, replies := env.Queue("server"), env.Queue("replies")
	r := newRouter(t, env, func(c *router.Config) {
		c.Retry = middleware.BackoffConfig{Delays: []time.Duration{10 * time.Millisecond}, MaxAttempts: 3}
	})
	var seen attempts
	require.NoError(t, r.AddHandler(router.HandlerConfig{Queue: queue, Reply: true},
		func(msg *message.Message) ([]*message.Message, error) {
			if seen.add(queue, msg) < 3 {
				return nil, errors.New("fails twice")
			}
			if msg.UUID == "doomed" {
				return nil, errors.New("fails again")
			}
			return []*message.Message{msg.Copy()}, nil
		}))
	start(t, r)
	_, err := env.Channel().QueueDeclare(replies, false, false, false, false, nil)
	require.NoError(t, err)
	for _, id := range []string{"echo", "doomed"} {
		publishRaw(t, env, "", queue, amqp.Publishing{MessageId: id, ReplyTo: replies, CorrelationId: "c-" + id,
			Headers: amqp.Table{"tenant": "t1"}})
	}
	got := map[string]amqp.Delivery{}
	require.Eventually(t, func() bool {
		for _, d := range drain(t, env, replies) {
			got[d.CorrelationId] = d
		}
		return len(got) == 2
	}, testenv.Patience(), 20*time.Millisecond)
	assert.Equal(t, []int{1, 2, 3}, seen.get(queue, "echo"))

	reply := got["c-echo"]
	assert.Equal(t, "t1", reply.Headers["tenant"], "the message's own headers are kept")
	assert.Empty(t, bookkeeping(reply.Headers), "reply")

	errReply := got["c-doomed"]
	assert.Equal(t, "fails again", errReply.Headers[warren.RPCErrorKey])
	assert.Equal(t, warren.PoisonReasonExhausted, errReply.Headers[warren.PoisonReasonKey])
	assert.Equal(t, "3", errReply.Headers[warren.PoisonAttemptsKey])
	var record []string
	for _, k := range bookkeeping(errReply.Headers) {
		if !strings.HasPrefix(k, warren.PoisonHeaderPrefix) {
			record = append(record, k)
		}
	}
	assert.Empty(t, record, "error reply: only the poison record")
}

// bookkeeping lists the headers of h that are a delivery's bookkeeping, but those of the
// delivery read: its publish id, and the count a quorum queue keeps.
func bookkeeping(h amqp.Table) []string {
	var out []string
	for k, v := range h {
		if warren.IsBookkeeping(k) && k != contract.PublishIDHeader && k != "x-delivery-count" {
			out = append(out, fmt.Sprintf("%s=%v", k, v))
		}
	}
	return out
}
