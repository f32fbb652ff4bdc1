package rpc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/handlers"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/rpc"
	"github.com/warrenmq/warren/topology"
)

type request struct {
	N    int    `json:"n"`
	From string `json:"from"`
}

type response struct {
	N      int    `json:"n"`
	Double int    `json:"double"`
	From   string `json:"from"`
}

func double(_ context.Context, req request) (response, error) {
	return response{N: req.N, Double: 2 * req.N, From: req.From}, nil
}

// serve runs a router with fn as the replying handler of queue until the test ends.
func serve(t *testing.T, env *testenv.Env, queue string, retry *middleware.BackoffConfig, fn message.HandlerFunc) *router.Router {
	t.Helper()
	r, err := router.New(router.Config{
		Connection:      env.Connection(),
		ShutdownTimeout: 10 * time.Second,
		Topology:        topology.Config{Delay: env.Delay(topology.Delay{})},
	}, env.Logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	require.NoError(t, r.AddHandler(router.HandlerConfig{Queue: queue, Reply: true, Concurrency: 32, Retry: retry}, fn))
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() { _ = stop(r, done) })
	select {
	case <-r.Running():
	case err := <-done:
		t.Fatalf("router stopped at once: %v", err)
	case <-time.After(testenv.Patience()):
		t.Fatal("router did not start")
	}
	return r
}

// modes are the two ways of receiving replies: direct reply-to, and a reply queue.
func modes(env *testenv.Env) map[string]func(*rpc.ClientConfig) {
	return map[string]func(*rpc.ClientConfig){
		"direct": func(*rpc.ClientConfig) {},
		"queue": func(c *rpc.ClientConfig) {
			c.ReplyQueue = env.Name("replies")
			env.Remove([]string{c.ReplyQueue}, nil)
		},
	}
}

func newClient(t *testing.T, env *testenv.Env, mod func(*rpc.ClientConfig)) *rpc.Client {
	t.Helper()
	cfg := rpc.ClientConfig{Connection: env.Connection()}
	if mod != nil {
		mod(&cfg)
	}
	c, err := rpc.NewClient(cfg, env.Logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestConcurrentCalls: 200 calls at once, on one client, each get their own answer, with
// direct reply-to and with a reply queue.
func TestConcurrentCalls(t *testing.T) {
	env := testenv.Logic(t)
	queue := env.Queue("double")
	serve(t, env, queue, nil, rpc.Handler(double))
	for name, mod := range modes(env) {
		t.Run(name, func(t *testing.T) {
			c := newClient(t, env, mod)
			const calls = 200
			var wg sync.WaitGroup
			errs := make(chan error, calls)
			for i := range calls {
				wg.Add(1)
				go func() {
					defer wg.Done()
					from := fmt.Sprintf("caller-%d", i)
					resp, err := rpc.Call[request, response](context.Background(), c, queue, request{N: i, From: from})
					switch {
					case err != nil:
						errs <- fmt.Errorf("call %d: %w", i, err)
					case resp != response{N: i, Double: 2 * i, From: from}:
						errs <- fmt.Errorf("call %d got another's answer: %+v", i, resp)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			assert.Zero(t, c.InFlight())
		})
	}
}

// TestTimeout: a call that gets no reply fails after ClientConfig.Timeout with an error that
// says so and wraps context.DeadlineExceeded; nothing of it is left, and the reply queue is
// gone once the client is closed.
func TestTimeout(t *testing.T) {
	env := testenv.Logic(t)
	queue := env.Queue("silent")
	ch := env.Channel()
	_, err := ch.QueueDeclare(queue, true, false, false, false, nil) // no consumer ever answers
	require.NoError(t, err)
	for name, mod := range modes(env) {
		t.Run(name, func(t *testing.T) {
			var replyQueue string
			c := newClient(t, env, func(cfg *rpc.ClientConfig) {
				mod(cfg)
				cfg.Timeout = 300 * time.Millisecond
				replyQueue = cfg.ReplyQueue
			})
			_, err := c.Call(context.Background(), queue, message.NewMessage(watermill.NewUUID(), []byte("anyone?")))
			require.Error(t, err)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Contains(t, err.Error(), "no reply")
			assert.Contains(t, err.Error(), "ClientConfig.Timeout 300ms")
			assert.Zero(t, c.InFlight())

			// The caller's own deadline: its error, whichever is first.
			ctx, cancel := context.WithCancelCause(context.Background())
			cancel(errors.New("caller gave up"))
			_, err = c.Call(ctx, queue, message.NewMessage(watermill.NewUUID(), nil))
			assert.ErrorContains(t, err, "caller gave up")
			assert.Zero(t, c.InFlight())

			require.NoError(t, c.Close())
			if replyQueue != "" {
				_, err := env.Inspect(replyQueue)
				assert.True(t, amqpx.IsNotFound(err), "reply queue %s left after Close: %v", replyQueue, err)
			}
		})
	}
}

// TestPoisonedRequestGetsErrorReply: a request given up by the server (a permanent error at
// once, or its last attempt failed) is answered with an error reply: Call returns a
// *RemoteError that says why, long before its time limit; the request is in the poison
// queue.
func TestPoisonedRequestGetsErrorReply(t *testing.T) {
	env := testenv.Logic(t)
	permanent, flaky := env.Queue("permanent"), env.Queue("flaky")
	serve(t, env, permanent, nil, rpc.Handler(func(context.Context, request) (response, error) {
		return response{}, warren.Permanent(errors.New("no such account"))
	}))
	var attempts atomic.Int32
	serve(t, env, flaky, &middleware.BackoffConfig{Delays: []time.Duration{10 * time.Millisecond, 10 * time.Millisecond}},
		rpc.Handler(func(context.Context, request) (response, error) {
			attempts.Add(1)
			return response{}, errors.New("ledger unavailable")
		}))
	for name, mod := range modes(env) {
		t.Run(name, func(t *testing.T) {
			c := newClient(t, env, mod)
			_, err := rpc.Call[request, response](context.Background(), c, permanent, request{N: 1})
			var remote *rpc.RemoteError
			require.ErrorAs(t, err, &remote)
			assert.Equal(t, warren.PoisonReasonPermanent, remote.Reason)
			assert.Contains(t, remote.Err, "no such account")
			assert.Equal(t, permanent, remote.Queue)
			assert.Equal(t, 1, remote.Attempts)
			assert.Contains(t, err.Error(), "poisoned")

			attempts.Store(0)
			_, err = rpc.Call[request, response](context.Background(), c, flaky, request{N: 2})
			require.ErrorAs(t, err, &remote)
			assert.Equal(t, warren.PoisonReasonExhausted, remote.Reason)
			assert.Contains(t, remote.Err, "ledger unavailable")
			assert.Equal(t, 3, remote.Attempts)
			assert.EqualValues(t, 3, attempts.Load())

			// An undecodable request is a permanent error too.
			_, err = c.Call(context.Background(), flaky, message.NewMessage(watermill.NewUUID(), []byte("{not json")))
			require.ErrorAs(t, err, &remote)
			assert.Equal(t, warren.PoisonReasonPermanent, remote.Reason)
		})
	}
	assert.Equal(t, 2, env.Messages(topology.PoisonQueue(permanent)))
	assert.Equal(t, 4, env.Messages(topology.PoisonQueue(flaky)))
}

// TestReplyToGoneCaller: a reply whose caller is gone (its reply queue deleted, its direct
// reply-to channel closed) is dropped: the request is acked, neither retried nor poisoned.
func TestReplyToGoneCaller(t *testing.T) {
	env := testenv.Logic(t)
	queue := env.Queue("gone")
	release := make(chan struct{})
	var calls atomic.Int32
	serve(t, env, queue, nil, rpc.Handler(func(ctx context.Context, req request) (response, error) {
		calls.Add(1)
		if req.From == "wait" {
			<-release
		}
		return double(ctx, req)
	}))

	// A reply queue that does not exist (any more).
	ch := env.Channel()
	require.NoError(t, ch.Confirm(false))
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, true, false, amqp.Publishing{
		ReplyTo: env.Name("no.such.queue"), CorrelationId: "gone-1", Body: []byte(`{"n":1}`)})
	require.NoError(t, err)
	require.True(t, dc.Wait())

	// A direct reply-to caller that timed out and closed.
	c := newClient(t, env, func(cfg *rpc.ClientConfig) { cfg.Timeout = 200 * time.Millisecond })
	_, err = rpc.Call[request, response](context.Background(), c, queue, request{N: 2, From: "wait"})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, c.Close())
	close(release)

	require.Eventually(t, func() bool { return calls.Load() == 2 }, testenv.Patience(), 10*time.Millisecond)
	require.Eventually(t, func() bool { return env.Messages(queue) == 0 }, testenv.Patience(), 10*time.Millisecond)
	assert.Never(t, func() bool {
		return calls.Load() != 2 || env.Messages(queue) != 0 || env.Messages(topology.PoisonQueue(queue)) != 0
	}, time.Second, 50*time.Millisecond, "the replies to gone callers were retried or poisoned")
}

// TestSend: Send fires and forgets: the server gets the request without reply-to and its
// reply is dropped; a request no queue takes fails at once.
func TestSend(t *testing.T) {
	env := testenv.Logic(t)
	queue := env.Queue("send")
	got := make(chan *message.Message, 1)
	serve(t, env, queue, nil, func(msg *message.Message) ([]*message.Message, error) {
		got <- msg
		reply, err := handlers.NewJSON(msg.Context(), "ignored")
		return []*message.Message{reply}, err
	})
	for name, mod := range modes(env) {
		t.Run(name, func(t *testing.T) {
			c := newClient(t, env, mod)
			require.NoError(t, rpc.Send(context.Background(), c, queue, request{N: 7}))
			select {
			case msg := <-got:
				assert.JSONEq(t, `{"n":7,"from":""}`, string(msg.Payload))
				assert.Empty(t, msg.Metadata.Get(warren.MetadataReplyTo))
				assert.NotEmpty(t, msg.Metadata.Get(warren.MetadataCorrelationID))
			case <-time.After(testenv.Patience()):
				t.Fatal("the request did not arrive")
			}

			err := rpc.Send(context.Background(), c, env.Name("nobody"), request{})
			var ret *dlx.ReturnedError
			require.ErrorAs(t, err, &ret)
			_, err = rpc.Call[request, response](context.Background(), c, env.Name("nobody"), request{})
			require.ErrorAs(t, err, &ret)
			assert.Zero(t, c.InFlight())
		})
	}
	assert.Never(t, func() bool { return env.Messages(topology.PoisonQueue(queue)) != 0 }, 500*time.Millisecond, 50*time.Millisecond)
}

// TestClose: Close ends the calls waiting for a reply with ErrClosed, and later calls fail.
func TestClose(t *testing.T) {
	env := testenv.Logic(t)
	queue := env.Queue("close")
	ch := env.Channel()
	_, err := ch.QueueDeclare(queue, true, false, false, false, nil)
	require.NoError(t, err)
	for name, mod := range modes(env) {
		t.Run(name, func(t *testing.T) {
			c := newClient(t, env, mod)
			errs := make(chan error, 1)
			go func() {
				_, err := c.Call(context.Background(), queue, message.NewMessage(watermill.NewUUID(), nil))
				errs <- err
			}()
			require.Eventually(t, func() bool { return env.Messages(queue) > 0 }, testenv.Patience(), 10*time.Millisecond)
			require.NoError(t, c.Close())
			assert.ErrorIs(t, <-errs, warren.ErrClosed)
			_, err := c.Call(context.Background(), queue, message.NewMessage(watermill.NewUUID(), nil))
			assert.ErrorIs(t, err, warren.ErrClosed)
			_, _ = ch.QueuePurge(queue, false)
		})
	}
}

func TestClientConfigValidate(t *testing.T) {
	url := warren.Connection{URL: "amqp://guest:secret@127.0.0.1:5672/"}
	for _, tc := range []struct {
		cfg  rpc.ClientConfig
		want string
	}{
		{rpc.ClientConfig{}, "rpc: ClientConfig.Connection.URL is empty"},
		{rpc.ClientConfig{Connection: url, Timeout: -1}, "rpc: ClientConfig.Timeout -1ns is negative"},
		{rpc.ClientConfig{Connection: url, ReplyQueueExpires: -time.Second}, "rpc: ClientConfig.ReplyQueueExpires -1s is negative"},
		{rpc.ClientConfig{Connection: url, ReplyQueue: "amq.rabbitmq.reply-to"}, "rpc: ClientConfig.ReplyQueue \"amq.rabbitmq.reply-to\""},
		{rpc.ClientConfig{Connection: url, ReplyQueue: strings.Repeat("q", 256)}, "rpc: ClientConfig.ReplyQueue is 256 bytes long"},
		{rpc.ClientConfig{Connection: url, ReplyQueueType: "stream"}, "rpc: ClientConfig.ReplyQueueType \"stream\""},
	} {
		err := tc.cfg.Validate()
		require.Error(t, err)
		assert.Contains(t, err.Error(), tc.want)
		assert.NotContains(t, err.Error(), "secret")
	}
	assert.NoError(t, rpc.ClientConfig{Connection: url}.Validate())
	d := rpc.ClientConfig{}.WithDefaults()
	assert.Equal(t, rpc.DefaultTimeout, d.Timeout)
	assert.Equal(t, rpc.DefaultReplyQueueExpires, d.ReplyQueueExpires)
	assert.Equal(t, topology.Quorum, d.ReplyQueueType)
}

func TestRouterRefusesReplyWithPublishTopic(t *testing.T) {
	env := testenv.Logic(t)
	r, err := router.New(router.Config{Connection: env.Connection(), Topology: topology.Config{Delay: env.Delay(topology.Delay{})}}, nil)
	require.NoError(t, err)
	defer r.Close()
	err = r.AddHandler(router.HandlerConfig{Queue: env.Queue("x"), Reply: true, PublishTopic: "elsewhere"}, rpc.Handler(double))
	assert.ErrorContains(t, err, "HandlerConfig.PublishTopic \"elsewhere\" is set with Reply")
}

// TestReconnect: the client connects again after its connection is lost or its consumer
// cancelled. With a reply queue, a reply sent meanwhile waits there and the call gets it;
// with direct reply-to the call fails at once with ErrReplyLost.
func TestReconnect(t *testing.T) {
	env := testenv.New(t)
	queue := env.Queue("reconnect")
	type waiting struct {
		correlationID string
		release       chan struct{}
	}
	arrived := make(chan waiting, 1) // a request that waits for its release
	serve(t, env, queue, nil, func(msg *message.Message) ([]*message.Message, error) {
		if string(msg.Payload) == "wait" {
			w := waiting{msg.Metadata.Get(warren.MetadataCorrelationID), make(chan struct{})}
			arrived <- w
			<-w.release
		}
		return []*message.Message{message.NewMessage(watermill.NewUUID(), []byte("done"))}, nil
	})
	for _, tc := range []struct {
		name   string
		queue  bool
		cancel bool // the consumer is cancelled, instead of the connection dropped
	}{{"queue", true, false}, {"direct", false, false}, {"queue cancelled", true, true}, {"direct cancelled", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			proxy, url := testenv.ProxyURL(t, env.URL)
			c := newClient(t, env, func(cfg *rpc.ClientConfig) {
				cfg.Connection.URL = url
				if tc.queue {
					cfg.ReplyQueue = env.Name("replies." + strings.ReplaceAll(tc.name, " ", "."))
					env.Remove([]string{cfg.ReplyQueue}, nil)
				}
			})
			type answer struct {
				reply *message.Message
				err   error
			}
			answers := make(chan answer, 1)
			go func() {
				reply, err := c.Call(context.Background(), queue, message.NewMessage(watermill.NewUUID(), []byte("wait")))
				answers <- answer{reply, err}
			}()
			w := <-arrived // the request is with the server, and (next) the client knows the broker has it
			require.Eventually(t, func() bool { return c.Sent(w.correlationID) }, testenv.Patience(), time.Millisecond)
			if tc.cancel {
				require.Equal(t, 1, proxy.CancelConsumers(""))
			} else {
				proxy.Drop()
			}
			if tc.queue { // the reply waits in the reply queue for the client's return
				close(w.release)
				a := <-answers
				require.NoError(t, a.err)
				assert.Equal(t, "done", string(a.reply.Payload))
			} else { // direct reply-to: the channel is gone, and the reply can no longer arrive
				a := <-answers
				require.ErrorIs(t, a.err, rpc.ErrReplyLost)
				close(w.release)
			}
			reply, err := c.Call(context.Background(), queue, message.NewMessage(watermill.NewUUID(), []byte("at once")))
			require.NoError(t, err)
			assert.Equal(t, "done", string(reply.Payload))
		})
	}
}

// TestTrace: a call's request, the server's processing and its reply are in the caller's
// trace.
func TestTrace(t *testing.T) {
	env := testenv.Logic(t)
	queue := env.Queue("traced")
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	r, err := router.New(router.Config{
		Connection: env.Connection(), TracerProvider: tp,
		Topology: topology.Config{Delay: env.Delay(topology.Delay{})},
	}, env.Logger())
	require.NoError(t, err)
	require.NoError(t, r.AddHandler(router.HandlerConfig{Queue: queue, Reply: true}, rpc.Handler(double)))
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	defer func() { _ = stop(r, done) }()
	<-r.Running()

	c := newClient(t, env, func(cfg *rpc.ClientConfig) { cfg.TracerProvider = tp })
	ctx, root := tp.Tracer("test").Start(context.Background(), "caller")
	_, err = rpc.Call[request, response](ctx, c, queue, request{N: 1})
	require.NoError(t, err)
	root.End()

	kinds := map[trace.SpanKind][]string{}
	require.Eventually(t, func() bool { // the server's spans end after the reply went out
		kinds = map[trace.SpanKind][]string{}
		for _, s := range spans.Ended() {
			if s.SpanContext().TraceID() == root.SpanContext().TraceID() {
				kinds[s.SpanKind()] = append(kinds[s.SpanKind()], s.Name())
			}
		}
		return len(kinds[trace.SpanKindProducer]) == 2 && len(kinds[trace.SpanKindConsumer]) == 1
	}, testenv.Patience(), 10*time.Millisecond, "spans of the caller's trace: %v", kinds)
}

// TestReplyQueueIsTheClientsOwn: a second client with the same reply queue is refused at once
// (it would take the first one's replies): a classic queue refuses its exclusive consumer, a
// quorum queue's consumers are counted.
func TestReplyQueueIsTheClientsOwn(t *testing.T) {
	env := testenv.Logic(t)
	for _, typ := range []topology.QueueType{topology.Quorum, topology.Classic} {
		t.Run(string(typ), func(t *testing.T) {
			replies := env.Name("replies." + string(typ))
			env.Remove([]string{replies}, nil)
			cfg := rpc.ClientConfig{Connection: env.Connection(), ReplyQueue: replies, ReplyQueueType: typ}
			newClient(t, env, func(c *rpc.ClientConfig) { *c = cfg })
			_, err := rpc.NewClient(cfg, env.Logger())
			require.Error(t, err)
			assert.Contains(t, err.Error(), replies)
		})
	}
}

// stop closes r and waits for its Run, which sends its error to done, to return.
func stop(r *router.Router, done <-chan error) error {
	err := r.Close()
	return errors.Join(err, <-done)
}

// TestForeignCaller: a plain AMQP client (amqp091-go, direct reply-to, as RabbitMQ's RPC
// tutorial writes it) gets the reply with its correlation id in the property; a request
// without a correlation id gets its message id.
func TestForeignCaller(t *testing.T) {
	env := testenv.Logic(t)
	queue := env.Queue("foreign")
	serve(t, env, queue, nil, rpc.Handler(double))

	ch := env.Channel()
	replies, err := ch.Consume(warren.DirectReplyTo, "", true, false, false, false, nil)
	require.NoError(t, err)
	for _, tc := range []struct {
		request       amqp.Publishing
		correlationID string
		double        int
	}{
		{amqp.Publishing{CorrelationId: "corr-1", MessageId: "msg-1", ReplyTo: warren.DirectReplyTo, Body: []byte(`{"n":4}`)}, "corr-1", 8},
		{amqp.Publishing{MessageId: "msg-2", ReplyTo: warren.DirectReplyTo, Body: []byte(`{"n":5}`)}, "msg-2", 10},
	} {
		require.NoError(t, ch.PublishWithContext(context.Background(), "", queue, true, false, tc.request))
		select {
		case d := <-replies:
			assert.Equal(t, tc.correlationID, d.CorrelationId)
			var resp response
			require.NoError(t, json.Unmarshal(d.Body, &resp))
			assert.Equal(t, tc.double, resp.Double)
		case <-time.After(testenv.Patience()):
			t.Fatal("no reply")
		}
	}
}
