package memrabbit_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/ledger"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/rpc"
	"github.com/warrenmq/warren/topology"
)

// The conformance cases of warren's own behaviour on a broker: the delay levels' arithmetic,
// retries, poison, the kill switch. They run warren's components on both brokers.

// runRouter runs r until the case ends.
func runRouter(s side, r *router.Router) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	s.t.Cleanup(func() {
		cancel()
		assert.NoError(s.t, <-done)
		assert.NoError(s.t, r.Close())
	})
	select {
	case <-r.Running():
	case err := <-done:
		s.t.Fatalf("router: %v", err)
	}
}

func TestADelayIsSpelledInTheLevelsDigits(t *testing.T) {
	conformance(t, func(s side) {
		d := s.delay()
		pub, err := dlx.NewPublisher(dlx.Config{Connection: s.conn, Topology: topology.Config{Delay: d}}, watermill.NopLogger{})
		require.NoError(s.t, err)
		defer pub.Close()
		q := s.name("q")
		ds := consumeWorkQueue(s, d, q)
		start := time.Now()
		msg := message.NewMessage("m", []byte("later"))
		warren.Delay(msg, 300*time.Millisecond) // 0x12c ms: digits 1, 2 and 12
		require.NoError(s.t, pub.Publish(q, msg))
		published := time.Now()
		got := receive(s, ds)
		assert.GreaterOrEqual(s.t, time.Since(start), 300*time.Millisecond, "never early")
		var path []any
		deaths, _ := got.Headers["x-death"].([]any)
		for _, e := range deaths {
			path = append(path, e.(amqp.Table)["queue"])
		}
		// The levels it waited in, one per nonzero digit of 300 ms less what the publish took
		// (nothing on the fake clock; up to a few tens of ms on a busy machine), in radix 16,
		// highest position first.
		dd := d.WithDefaults()
		var positions []int
		total := time.Duration(0)
		for _, q := range path {
			found := false
			for p := range dd.Levels {
				for digit := 1; digit < dd.Radix; digit++ {
					if q == dd.LevelQueue(p, digit) {
						positions, found = append(positions, p), true
						total += time.Duration(digit) * time.Duration(math.Pow(16, float64(p))) * time.Millisecond
					}
				}
			}
			require.True(s.t, found, "not a level queue: %v", q)
		}
		assert.LessOrEqual(s.t, total, 300*time.Millisecond)
		assert.GreaterOrEqual(s.t, total, 300*time.Millisecond-published.Sub(start)-time.Millisecond, "%v", path)
		hops := slices.Sorted(slices.Values(positions)) // in time order: the highest position first
		slices.Reverse(hops)
		want := []int{}
		for _, h := range hops { // each death: its entry first, then the others
			if version, _ := brokerVersion(); strings.HasPrefix(version, "3.") && len(want) >= 2 {
				slices.Reverse(want) // 3.10 reverses the older entries each time
			}
			want = append([]int{h}, want...)
		}
		assert.Equal(s.t, want, positions, "%v", path)
	})
}

func TestRetriesFollowTheScheduleThenPoison(t *testing.T) {
	conformance(t, func(s side) {
		r, err := router.New(router.Config{Connection: s.conn, Topology: topology.Config{Delay: s.delay()},
			Retry: backoffOf(100*time.Millisecond, 200*time.Millisecond)}, watermill.NopLogger{})
		require.NoError(s.t, err)
		q := s.name("q")
		var mu sync.Mutex
		var at []time.Time
		require.NoError(s.t, r.AddConsumerHandler(router.HandlerConfig{Queue: q}, func(*message.Message) error {
			mu.Lock()
			defer mu.Unlock()
			at = append(at, time.Now())
			return errors.New("down")
		}))
		runRouter(s, r)
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		poisoned, err := ch.Consume(topology.PoisonQueue(q), "", true, false, false, false, nil)
		require.NoError(s.t, err)
		require.NoError(s.t, r.Publisher().Publish(q, message.NewMessage("m", []byte("x"))))
		p := receive(s, poisoned)
		assert.Equal(s.t, warren.PoisonReasonExhausted, p.Headers[warren.PoisonReasonKey])
		assert.Equal(s.t, "down", p.Headers[warren.PoisonErrorKey])
		assert.Equal(s.t, "3", p.Headers[warren.PoisonAttemptsKey])
		mu.Lock()
		defer mu.Unlock()
		require.Len(s.t, at, 3)
		assert.GreaterOrEqual(s.t, at[1].Sub(at[0]), 100*time.Millisecond)
		assert.GreaterOrEqual(s.t, at[2].Sub(at[1]), 200*time.Millisecond)
	})
}

func TestAPermanentErrorPoisonsAtOnce(t *testing.T) {
	conformance(t, func(s side) {
		r, err := router.New(router.Config{Connection: s.conn, Topology: topology.Config{Delay: s.delay()},
			Retry: backoffOf(time.Hour)}, watermill.NopLogger{})
		require.NoError(s.t, err)
		q := s.name("q")
		calls := make(chan struct{}, 4)
		require.NoError(s.t, r.AddConsumerHandler(router.HandlerConfig{Queue: q}, func(*message.Message) error {
			calls <- struct{}{}
			return warren.Permanent(errors.New("malformed"))
		}))
		runRouter(s, r)
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		poisoned, err := ch.Consume(topology.PoisonQueue(q), "", true, false, false, false, nil)
		require.NoError(s.t, err)
		require.NoError(s.t, r.Publisher().Publish(q, message.NewMessage("m", []byte("x"))))
		p := receive(s, poisoned)
		assert.Equal(s.t, warren.PoisonReasonPermanent, p.Headers[warren.PoisonReasonKey])
		assert.Len(s.t, calls, 1)
	})
}

func TestTheKillSwitchStopsAndResumesAConsumer(t *testing.T) {
	conformance(t, func(s side) {
		events := make(chan router.KillEvent, 16)
		r, err := router.New(router.Config{Connection: s.conn, Topology: topology.Config{Delay: topology.Delay{Disabled: true}},
			OnKill: func(e router.KillEvent) { events <- e }}, watermill.NopLogger{})
		require.NoError(s.t, err)
		q := s.name("q")
		handled := make(chan string, 4)
		require.NoError(s.t, r.AddConsumerHandler(router.HandlerConfig{Queue: q}, func(m *message.Message) error {
			handled <- string(m.Payload)
			return nil
		}))
		runRouter(s, r)
		k, err := kill.NewKiller(kill.Config{Connection: s.conn}, nil)
		require.NoError(s.t, err)
		ctx := context.Background()
		require.NoError(s.t, k.Kill(ctx, q, kill.Stop))
		assert.Equal(s.t, "stopped", (<-events).State)
		require.NoError(s.t, r.Publisher().Publish(q, message.NewMessage("m", []byte("waits"))))
		select {
		case m := <-handled:
			s.t.Fatalf("handled %q while stopped", m)
		case <-time.After(300 * time.Millisecond):
		}
		require.NoError(s.t, k.Resume(ctx, q))
		assert.Equal(s.t, "resumed", (<-events).State)
		m, _ := within(s, handled, "not handled after the resume")
		assert.Equal(s.t, "waits", m)
	})
}

// backoffOf is a retry schedule of delays.
func backoffOf(delays ...time.Duration) middleware.BackoffConfig {
	return middleware.BackoffConfig{Delays: delays}
}

func TestAMessageWithoutADelayArrivesAtOnce(t *testing.T) {
	conformance(t, func(s side) {
		d := s.delay()
		pub, err := dlx.NewPublisher(dlx.Config{Connection: s.conn, Topology: topology.Config{Delay: d}}, watermill.NopLogger{})
		require.NoError(s.t, err)
		defer pub.Close()
		q := s.name("q")
		ds := consumeWorkQueue(s, d, q)
		require.NoError(s.t, pub.Publish(q, message.NewMessage("m", []byte("now"))))
		got := receive(s, ds)
		assert.Equal(s.t, "now", string(got.Body))
		assert.NotContains(s.t, got.Headers, "x-death", "no level waited in")
	})
}

func TestAnRPCCallIsAnswered(t *testing.T) {
	conformance(t, func(s side) {
		r, err := router.New(router.Config{Connection: s.conn, Topology: topology.Config{Delay: s.delay()}}, watermill.NopLogger{})
		require.NoError(s.t, err)
		q := s.name("q")
		require.NoError(s.t, r.AddHandler(router.HandlerConfig{Queue: q, Reply: true},
			rpc.Handler(func(_ context.Context, n int) (int, error) { return 2 * n, nil })))
		runRouter(s, r)
		c, err := rpc.NewClient(rpc.ClientConfig{Connection: s.conn}, watermill.NopLogger{})
		require.NoError(s.t, err)
		defer c.Close()
		got, err := rpc.Call[int, int](context.Background(), c, q, 21)
		require.NoError(s.t, err)
		assert.Equal(s.t, 42, got)
	})
}

func TestACancelledScheduledMessageNeverArrives(t *testing.T) {
	conformance(t, func(s side) {
		d := s.delay()
		pub, err := dlx.NewPublisher(dlx.Config{Connection: s.conn, Topology: topology.Config{Delay: d}}, watermill.NopLogger{})
		require.NoError(s.t, err)
		defer pub.Close()
		l, err := ledger.New(ledger.Config{Connection: s.conn, Delay: pub.Delay()}, watermill.NopLogger{})
		require.NoError(s.t, err)
		defer l.Close()
		r, err := router.New(router.Config{Connection: s.conn, Topology: topology.Config{Delay: d}}, watermill.NopLogger{})
		require.NoError(s.t, err)
		q := s.name("q")
		arrived := make(chan string, 2)
		require.NoError(s.t, r.AddConsumerHandler(router.HandlerConfig{Queue: q, Middleware: []message.HandlerMiddleware{l.Middleware}},
			func(m *message.Message) error {
				arrived <- m.UUID
				return nil
			}))
		runRouter(s, r)
		for _, id := range []string{"kept", "cancelled"} {
			m := message.NewMessage(id, []byte(id))
			warren.Delay(m, 2*time.Second) // time enough for the cancel on a busy machine
			warren.Schedule(m, id)
			require.NoError(s.t, pub.Publish(q, m))
		}
		require.NoError(s.t, l.Cancel(context.Background(), "cancelled"))
		id, _ := within(s, arrived, "nothing arrived")
		assert.Equal(s.t, "kept", id)
		select {
		case id := <-arrived:
			s.t.Fatalf("%s arrived", id)
		case <-time.After(500 * time.Millisecond):
		}
	})
}

// consumeWorkQueue declares q as warren declares a work queue (with delay layout d) and
// consumes it, acking on delivery.
func consumeWorkQueue(s side, d topology.Delay, q string) <-chan amqp.Delivery {
	s.t.Helper()
	ch, err := s.dial().Channel()
	require.NoError(s.t, err)
	b, err := topology.NewBuilder(topology.Config{Delay: d}, nil)
	require.NoError(s.t, err)
	require.NoError(s.t, b.DeclareQueue(context.Background(), ch, topology.Queue{Name: q}))
	ds, err := ch.Consume(q, "", true, false, false, false, nil)
	require.NoError(s.t, err)
	return ds
}
