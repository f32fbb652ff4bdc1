package memrabbit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/handlers"
	"github.com/warrenmq/warren/internal/memrabbit"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/ledger"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/rpc"
	"github.com/warrenmq/warren/scheduler"
	"github.com/warrenmq/warren/topology"
)

type order struct {
	ID int `json:"id"`
}

// The README's smallest program, on the in-memory broker and the bubble's fake clock: a
// message delayed 2 s, failing twice, retried after 1 s and 5 s, handled on its third attempt
// 8 s after it was published.
func TestTheSmallestProgramRunsOnTheModel(t *testing.T) {
	wall := time.Now()
	synctest.Test(t, func(t *testing.T) {
		b := memrabbit.New(memrabbit.Config{})
		defer b.Close()
		r, err := router.New(router.Config{
			Connection: warren.Connection{URL: b.URL()},
			Retry:      middleware.BackoffConfig{Delays: []time.Duration{time.Second, 5 * time.Second}},
		}, watermill.NopLogger{})
		require.NoError(t, err)
		var mu sync.Mutex
		var attempts []time.Duration
		start := time.Now()
		handled := make(chan struct{})
		require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: "billing"},
			handlers.JSON(func(ctx context.Context, o order) error {
				mu.Lock()
				defer mu.Unlock()
				attempts = append(attempts, time.Since(start))
				if middleware.AttemptFromContext(ctx) < 3 {
					return errors.New("card service unavailable")
				}
				close(handled)
				return nil
			})))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- r.Run(ctx) }()
		<-r.Running()
		start = time.Now()
		msg, err := handlers.NewJSON(ctx, order{ID: 42})
		require.NoError(t, err)
		warren.Delay(msg, 2*time.Second)
		require.NoError(t, r.Publisher().Publish("billing", msg))
		<-handled
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, r.Close())
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, attempts, 3)
		assert.Equal(t, 2*time.Second, attempts[0].Truncate(time.Second), "delayed 2 s: %v", attempts)
		assert.Equal(t, 3*time.Second, attempts[1].Truncate(time.Second), "then 1 s: %v", attempts)
		assert.Equal(t, 8*time.Second, attempts[2].Truncate(time.Second), "then 5 s: %v", attempts)
	})
	t.Logf("wall time: %v", time.Since(wall))
}

// A daily job over a year of fake time: 365 ticks, a day apart, each published ahead and
// delayed through the delay levels until it is due.
func TestADailyJobOverAYearRunsOnTheModel(t *testing.T) {
	wall := time.Now()
	synctest.Test(t, func(t *testing.T) {
		b := memrabbit.New(memrabbit.Config{})
		defer b.Close()
		conn := warren.Connection{URL: b.URL()}
		ticks := consumeQueue(t, b, "reports")
		s, err := scheduler.New(scheduler.Config{Connection: conn, Name: "nightly",
			Jobs: []scheduler.Job{{Name: "report", Schedule: "@daily", Topic: "reports", Payload: []byte("run")}}}, nil)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- s.Run(ctx) }()
		start := time.Now()
		var got []time.Time
		for len(got) < 365 {
			d := <-ticks
			tick, err := time.Parse(time.RFC3339Nano, d.Headers[scheduler.MetadataTick].(string))
			require.NoError(t, err)
			assert.False(t, time.Now().Before(tick), "never early")
			got = append(got, tick)
		}
		assert.Less(t, time.Since(start), 366*24*time.Hour)
		for i := 1; i < len(got); i++ {
			require.Equal(t, 24*time.Hour, got[i].Sub(got[i-1]), "tick %d", i)
		}
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, s.Close())
	})
	t.Logf("wall time: %v", time.Since(wall))
}

// consumeQueue declares queue as warren declares a work queue, on a connection of its own to
// b, and returns its deliveries (auto-acked).
func consumeQueue(t *testing.T, b *memrabbit.Broker, queue string) <-chan amqp.Delivery {
	conn, err := amqp.DialConfig(b.URL(), amqp.Config{Dial: func(string, string) (net.Conn, error) { return b.Dial() }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	tb, err := topology.NewBuilder(topology.Config{Delay: topology.Delay{Disabled: true}}, nil)
	require.NoError(t, err)
	require.NoError(t, tb.DeclareQueue(context.Background(), ch, topology.Queue{Name: queue}))
	ds, err := ch.Consume(queue, "", true, false, false, false, nil)
	require.NoError(t, err)
	return ds
}

// Scheduled messages with the ledger: three due in 3 s, one 10 years ahead; one of the soon
// ones cancelled. The others arrive when due (the one 10 years ahead too), the cancelled one
// never does.
func TestScheduledMessagesAndTheLedgerRunOnTheModel(t *testing.T) {
	wall := time.Now()
	synctest.Test(t, func(t *testing.T) {
		b := memrabbit.New(memrabbit.Config{})
		defer b.Close()
		conn := warren.Connection{URL: b.URL()}
		pub, err := dlx.NewPublisher(dlx.Config{Connection: conn}, watermill.NopLogger{})
		require.NoError(t, err)
		defer pub.Close()
		l, err := ledger.New(ledger.Config{Connection: conn, Delay: pub.Delay()}, watermill.NopLogger{})
		require.NoError(t, err)
		defer l.Close()
		const queue = "reminders"
		start := time.Now()
		due := map[string]time.Duration{"tea": 3 * time.Second, "call": 3 * time.Second, "stretch": 3 * time.Second,
			"passport": 10 * 365 * 24 * time.Hour}
		for id, d := range due {
			msg := message.NewMessage(id, []byte(id))
			warren.Delay(msg, d)
			warren.Schedule(msg, id)
			require.NoError(t, pub.Publish(queue, msg))
		}
		entries, err := l.List(context.Background(), ledger.Filter{Destination: queue})
		require.NoError(t, err)
		assert.Len(t, entries, 4)
		require.NoError(t, l.Cancel(context.Background(), "call"))

		r, err := router.New(router.Config{Connection: conn}, watermill.NopLogger{})
		require.NoError(t, err)
		arrived := make(chan string, 4)
		require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue, Middleware: []message.HandlerMiddleware{l.Middleware}},
			func(msg *message.Message) error {
				assert.GreaterOrEqual(t, time.Since(start), due[msg.UUID], "%s never early", msg.UUID)
				arrived <- msg.UUID
				return nil
			}))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- r.Run(ctx) }()
		got := map[string]bool{}
		for range 3 {
			got[<-arrived] = true
		}
		assert.Equal(t, map[string]bool{"tea": true, "stretch": true, "passport": true}, got)
		assert.Less(t, time.Since(start), 10*365*24*time.Hour+time.Hour)
		entries, err = l.List(context.Background(), ledger.Filter{Destination: queue})
		require.NoError(t, err)
		assert.Empty(t, entries, "nothing left scheduled")
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, r.Close())
	})
	t.Logf("wall time: %v", time.Since(wall))
}

// The kill switch: stop, resume, then drain and delete, heard by a router's consumer.
func TestTheKillSwitchRunsOnTheModel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memrabbit.New(memrabbit.Config{})
		defer b.Close()
		conn := warren.Connection{URL: b.URL()}
		const queue = "jobs"
		events := make(chan router.KillEvent, 16)
		r, err := router.New(router.Config{Connection: conn, OnKill: func(e router.KillEvent) { events <- e },
			Topology: topology.Config{Delay: topology.Delay{Disabled: true}}}, watermill.NopLogger{})
		require.NoError(t, err)
		defer r.Close()
		require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(*message.Message) error { return nil }))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- r.Run(ctx) }()
		<-r.Running()
		k, err := kill.NewKiller(kill.Config{Connection: conn}, nil)
		require.NoError(t, err)
		require.NoError(t, k.Kill(ctx, queue, kill.Stop))
		assert.Equal(t, "stopped", (<-events).State)
		require.NoError(t, k.Resume(ctx, queue))
		assert.Equal(t, "resumed", (<-events).State)
		require.NoError(t, k.Kill(ctx, queue, kill.Delete))
		var states []string
		for e := range events {
			states = append(states, e.State)
			if e.State == "deleted" {
				break
			}
		}
		assert.Equal(t, []string{"draining", "deleted"}, states)
		cancel()
		require.NoError(t, <-done)
	})
}

// A request and its reply, and an error reply for a request the server gives up.
func TestRPCRunsOnTheModel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := memrabbit.New(memrabbit.Config{})
		defer b.Close()
		conn := warren.Connection{URL: b.URL()}
		r, err := router.New(router.Config{Connection: conn}, watermill.NopLogger{})
		require.NoError(t, err)
		defer r.Close()
		require.NoError(t, r.AddHandler(router.HandlerConfig{Queue: "quotes", Reply: true},
			rpc.Handler(func(ctx context.Context, symbol string) (int, error) {
				if symbol != "WRN" {
					return 0, warren.Permanent(fmt.Errorf("unknown symbol %q", symbol))
				}
				return 4200, nil
			})))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- r.Run(ctx) }()
		<-r.Running()
		c, err := rpc.NewClient(rpc.ClientConfig{Connection: conn}, watermill.NopLogger{})
		require.NoError(t, err)
		defer c.Close()
		cents, err := rpc.Call[string, int](ctx, c, "quotes", "WRN")
		require.NoError(t, err)
		assert.Equal(t, 4200, cents)
		_, err = rpc.Call[string, int](ctx, c, "quotes", "XYZ")
		var remote *rpc.RemoteError
		require.ErrorAs(t, err, &remote)
		assert.Contains(t, remote.Err, `unknown symbol "XYZ"`)
		cancel()
		require.NoError(t, <-done)
	})
}

// A 7-step retry schedule of a day a step: a message failing every attempt is tried 8 times,
// a day apart, then poisoned.
func TestAWeekOfDailyRetriesRunsOnTheModel(t *testing.T) {
	wall := time.Now()
	synctest.Test(t, func(t *testing.T) {
		b := memrabbit.New(memrabbit.Config{})
		defer b.Close()
		day := 24 * time.Hour
		r, err := router.New(router.Config{
			Connection: warren.Connection{URL: b.URL()},
			Retry:      middleware.BackoffConfig{Delays: []time.Duration{day, day, day, day, day, day, day}},
		}, watermill.NopLogger{})
		require.NoError(t, err)
		start := time.Now()
		var mu sync.Mutex
		var attempts []time.Duration
		require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: "invoices"}, func(*message.Message) error {
			mu.Lock()
			defer mu.Unlock()
			attempts = append(attempts, time.Since(start))
			return errors.New("the ledger is closed")
		}))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- r.Run(ctx) }()
		<-r.Running()
		poisoned := consumeDeclared(t, b, topology.PoisonQueue("invoices"))
		start = time.Now()
		require.NoError(t, r.Publisher().Publish("invoices", message.NewMessage("inv-1", []byte("{}"))))
		p := <-poisoned
		assert.Equal(t, "inv-1", p.MessageId)
		mu.Lock()
		require.Len(t, attempts, 8)
		for i, at := range attempts {
			assert.Equal(t, time.Duration(i)*day, at.Truncate(time.Second), "attempt %d", i+1)
		}
		mu.Unlock()
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, r.Close())
	})
	t.Logf("wall time: %v", time.Since(wall))
}

// consumeDeclared consumes queue, declared already, on a connection of its own to b, and
// returns its deliveries (auto-acked).
func consumeDeclared(t *testing.T, b *memrabbit.Broker, queue string) <-chan amqp.Delivery {
	conn, err := amqp.DialConfig(b.URL(), amqp.Config{Dial: func(string, string) (net.Conn, error) { return b.Dial() }})
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	require.NoError(t, err)
	ds, err := ch.Consume(queue, "", true, false, false, false, nil)
	require.NoError(t, err)
	return ds
}
