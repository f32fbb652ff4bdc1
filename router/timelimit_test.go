package router_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/consumer"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// Every call with a limit returns within it, against a broker that accepts TCP and never
// answers, from the start or once it has refused connections for a while (a dial that begins
// late must not run its full timeout past the call's limit), and for concurrent callers (no
// dial holds the subscriber's mutex).
func TestTimeLimitsWithABrokerThatNeverAnswers(t *testing.T) {
	// Not parallel with other tests (its cases are, with each other): it measures wall-clock limits.
	testenv.Slow(t)
	const limit = 2 * time.Second
	calls := map[string]func(addr string) error{
		"NewPublisher": func(addr string) error {
			_, err := dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: "amqp://guest:guest@" + addr + "/", ConnectTimeout: limit}}, nil)
			return err
		},
		"Subscriber.SubscribeInitialize": func(addr string) error {
			s, err := consumer.NewSubscriber(consumer.Config{Connection: warren.Connection{URL: "amqp://guest:guest@" + addr + "/", ConnectTimeout: limit}}, nil)
			require.NoError(t, err)
			defer s.Close()
			return s.SubscribeInitialize("q")
		},
		"2 concurrent Subscriber.Subscribe": func(addr string) error {
			s, err := consumer.NewSubscriber(consumer.Config{Connection: warren.Connection{URL: "amqp://guest:guest@" + addr + "/", ConnectTimeout: limit}}, nil)
			require.NoError(t, err)
			defer s.Close()
			errs := make([]error, 2)
			var wg sync.WaitGroup
			for i := range errs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[i] = s.Subscribe(context.Background(), "q")
				}()
			}
			wg.Wait()
			require.Error(t, errs[0])
			require.Error(t, errs[1])
			// Which one dials, and whether the other waits for it or dials after it, is a race;
			// both keep the limit (the returned one is timed by the caller).
			assert.Contains(t, errs[0].Error(), "gave up after 2s")
			assert.Contains(t, errs[1].Error(), "gave up after 2s")
			if strings.Contains(errs[0].Error(), "AMQP handshake") {
				return errs[0]
			}
			return errs[1]
		},
		"Builder.Apply": func(addr string) error {
			b, err := topology.NewBuilder(topology.Config{Timeout: limit}, nil)
			require.NoError(t, err)
			return b.Apply(context.Background(), warren.Connection{URL: "amqp://guest:guest@" + addr + "/", ConnectTimeout: limit}, topology.Topology{})
		},
	}
	for _, broker := range []string{"black hole", "refusing, then black hole"} {
		for name, call := range calls {
			t.Run(broker+"/"+name, func(t *testing.T) {
				t.Parallel()
				addr := testenv.BlackHole(t)
				if broker != "black hole" {
					addr = testenv.BlackHoleAfter(t, limit/2)
				}
				start := time.Now()
				err := call(addr)
				testenv.WithinLimit(t, limit, time.Since(start), name)
				require.Error(t, err)
				assert.Contains(t, err.Error(), "gave up after 2s")
				assert.Contains(t, err.Error(), "AMQP handshake with "+addr)
			})
		}
	}
}

// Close on a router that was never run returns at once, and nil (Watermill alone would wait
// ShutdownTimeout+5s for handlers that never started, and fail).
func TestCloseWithoutRun(t *testing.T) {
	// Not parallel: it measures a wall-clock limit.
	env := testenv.Logic(t)
	r := newRouter(t, env, func(c *router.Config) { c.ShutdownTimeout = 2 * time.Second })
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: env.Queue("never-run")}, func(*message.Message) error { return nil }))
	start := time.Now()
	require.NoError(t, r.Close())
	assert.Less(t, time.Since(start), time.Second)
	require.NoError(t, r.Close(), "twice")
	assert.ErrorContains(t, r.Run(context.Background()), "after Close")
	assert.ErrorIs(t, r.Run(context.Background()), warren.ErrClosed)
	assert.ErrorIs(t, r.AddConsumerHandler(router.HandlerConfig{Queue: env.Queue("later")}, func(*message.Message) error { return nil }), warren.ErrClosed)
}

// A closed Subscriber refuses at once, with ErrClosed (it retried until ConnectTimeout).
func TestSubscribeAfterCloseIsErrClosed(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	s, err := consumer.NewSubscriber(consumer.Config{Connection: env.Connection()}, env.Logger())
	require.NoError(t, err)
	require.NoError(t, s.Close())
	_, err = s.Subscribe(context.Background(), env.Queue("after-close"))
	assert.ErrorIs(t, err, warren.ErrClosed)
}

// Close while Run still declares (the broker hangs) ends Run at once too.
func TestCloseWhileRunDeclares(t *testing.T) {
	// Not parallel: it measures a wall-clock limit.
	env := testenv.New(t)
	proxy, _ := testenv.ProxyURL(t, env.URL)
	addr, dialed := notifyDials(t, proxy.Addr())
	r := newRouter(t, env, func(c *router.Config) {
		c.Connection.URL = testenv.WithHost(t, env.URL, addr)
		c.ShutdownTimeout = 2 * time.Second
		c.Connection.ConnectTimeout = 2 * testenv.Patience() // New declares: a loaded broker takes seconds
	})
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: env.Queue("declaring")}, func(*message.Message) error { return nil }))
	proxy.Freeze()
	proxy.Drop()
	for len(dialed) > 0 { // the dials of New
		<-dialed
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select { // Run declares: its publisher dials again (it dials only when it needs to)
	case <-dialed:
	case <-time.After(testenv.Patience()):
		t.Fatal("Run did not dial to declare")
	}
	start := time.Now()
	require.NoError(t, r.Close())
	assert.Less(t, time.Since(start), time.Second)
	select {
	case err := <-done:
		t.Logf("Run returned %v", err)
	case <-time.After(time.Second):
		t.Fatal("Run did not return")
	}
}

// All config is validated in the constructors, and the error names the field as
// the user wrote it.
func TestEveryFieldIsValidatedNamingIt(t *testing.T) {
	t.Parallel()
	url := "amqp://guest:guest@127.0.0.1:1/"
	conn := warren.Connection{URL: url}
	for field, cfg := range map[string]router.Config{
		"router: Config.Connection.URL is empty":                                {},
		"router: Config.Connection.ConnectTimeout -1s":                          {Connection: warren.Connection{URL: url, ConnectTimeout: -time.Second}},
		"router: Config.Connection.AMQP.TLSClientConfig is set":                 {Connection: warren.Connection{URL: url, AMQP: amqp.Config{TLSClientConfig: &tls.Config{}}}},
		"router: Config.Concurrency -1":                                         {Connection: conn, Concurrency: -1},
		"router: Config.Concurrency 70000":                                      {Connection: conn, Concurrency: 70000},
		"router: Config.Prefetch 8 is outside Concurrency":                      {Connection: conn, Prefetch: 8},
		"router: Config.Retry: middleware: BackoffConfig.MaxAttempts -1":        {Connection: conn, Retry: middleware.BackoffConfig{MaxAttempts: -1}},
		"router: Config.Retry: middleware: BackoffConfig.Delays[1] -1s":         {Connection: conn, Retry: middleware.BackoffConfig{Delays: []time.Duration{time.Second, -time.Second}}},
		"router: Config.Retry: middleware: BackoffConfig.Multiplier 0.5":        {Connection: conn, Retry: middleware.BackoffConfig{Multiplier: 0.5}},
		"router: Config.ShutdownTimeout -1s":                                    {Connection: conn, ShutdownTimeout: -time.Second},
		"router: Config.PublishTimeout -1s":                                     {Connection: conn, PublishTimeout: -time.Second},
		"router: Config.PastTolerance -1s":                                      {Connection: conn, PastTolerance: -time.Second},
		"router: Config.KillMaxAge -1s":                                         {Connection: conn, KillMaxAge: -time.Second},
		"router: Config.Declare: topology: Queues[0].Name":                      {Connection: conn, Declare: topology.Topology{Queues: []topology.Queue{{}}}},
		"topology: Config.Timeout -1s":                                          {Connection: conn, Topology: topology.Config{Timeout: -time.Second}},
		`topology: Delay.Prefix "amq.delay"`:                                    {Connection: conn, Topology: topology.Config{Delay: topology.Delay{Prefix: "amq.delay"}}},
		"topology: Delay.Prefix " + `"` + strings.Repeat("p", 250) + `"`:        {Connection: conn, Topology: topology.Config{Delay: topology.Delay{Prefix: strings.Repeat("p", 250)}}},
		"router: Config.Declare: topology: Queues[0].Name is 250 bytes long":    {Connection: conn, Declare: topology.Topology{Queues: []topology.Queue{{Name: strings.Repeat("q", 250)}}}},
		"router: Config.Declare: topology: Exchanges[0].Name is 256 bytes long": {Connection: conn, Declare: topology.Topology{Exchanges: []topology.Exchange{{Name: strings.Repeat("x", 256)}}}},
	} {
		if cfg.Connection.ConnectTimeout == 0 {
			cfg.Connection.ConnectTimeout = 500 * time.Millisecond // a config wrongly accepted fails soon
		}
		_, err := router.New(cfg, nil)
		if assert.Error(t, err, field) {
			assert.Contains(t, err.Error(), field)
		}
	}

	for field, cfg := range map[string]consumer.Config{
		"consumer: Config.Connection.URL is empty":          {},
		"consumer: Config.ShutdownTimeout -1s":              {Connection: conn, ShutdownTimeout: -time.Second},
		"consumer: Config.Connection.ConnectTimeout -1s":    {Connection: warren.Connection{URL: url, ConnectTimeout: -time.Second}},
		"consumer: Config.KillMaxAge -1s":                   {Connection: conn, KillMaxAge: -time.Second},
		"consumer: Config.Connection.AMQP.Dial is set":      {Connection: warren.Connection{URL: url, AMQP: amqp.Config{Dial: amqp.DefaultDial(time.Second)}}},
		"consumer: Config.Connection.AMQP.Heartbeat -1s":    {Connection: warren.Connection{URL: url, AMQP: amqp.Config{Heartbeat: -time.Second}}},
		"consumer: Config.Connection.AMQP.FrameSize is set": {Connection: warren.Connection{URL: url, AMQP: amqp.Config{FrameSize: 4096}}},
		"consumer: Config.Connection.URL: parse":            {Connection: warren.Connection{URL: "127.0.0.1:5672"}},
	} {
		_, err := consumer.NewSubscriber(cfg, nil)
		if assert.Error(t, err, field) {
			assert.Contains(t, err.Error(), field)
		}
	}

	for field, cfg := range map[string]dlx.Config{
		"dlx: Config.Connection.ConnectTimeout -1s": {Connection: warren.Connection{URL: url, ConnectTimeout: -time.Second}, PublishTimeout: -time.Second, PastTolerance: -time.Second},
		"dlx: Config.PublishTimeout -1s":            {Connection: conn, PublishTimeout: -time.Second, PastTolerance: -time.Second},
		"dlx: Config.PastTolerance -1s":             {Connection: conn, PastTolerance: -time.Second},
	} {
		for range 10 { // the first field, every time
			_, err := dlx.NewPublisher(cfg, nil)
			if assert.Error(t, err, field) {
				assert.Contains(t, err.Error(), field)
			}
		}
	}

	env := testenv.Logic(t)
	r := newRouter(t, env, nil)
	q := env.Queue("valid")
	for field, h := range map[string]router.HandlerConfig{
		"router: HandlerConfig.Queue is empty":                                             {},
		"router: handler h: HandlerConfig.Keys is empty":                                   {Name: "h", Queue: q, Exchange: "events"},
		"router: handler h: HandlerConfig.Exchange is empty":                               {Name: "h", Queue: q, Keys: []string{"a.b"}},
		"router: handler h: HandlerConfig.Concurrency -1":                                  {Name: "h", Queue: q, Concurrency: -1},
		"router: handler h: HandlerConfig.Concurrency 70000":                               {Name: "h", Queue: q, Concurrency: 70000},
		"router: handler h: HandlerConfig.Retry: middleware: BackoffConfig.MaxAttempts -1": {Name: "h", Queue: q, Retry: &middleware.BackoffConfig{MaxAttempts: -1}},
		"router: handler h: HandlerConfig.Retry: middleware: BackoffConfig.Jitter 2":       {Name: "h", Queue: q, Retry: &middleware.BackoffConfig{Jitter: 2}},
		"router: handler amq.x: HandlerConfig.Queue":                                       {Queue: "amq.x"},
	} {
		err := r.AddConsumerHandler(h, func(*message.Message) error { return nil })
		if assert.Error(t, err, field) {
			assert.Contains(t, err.Error(), field)
		}
	}
	ordered := orderedRouter(t, env, q, 4, middleware.BackoffConfig{})
	err := ordered.AddConsumerHandler(router.HandlerConfig{Queue: q}, func(*message.Message) error { return nil })
	assert.ErrorContains(t, err, fmt.Sprintf("router: handler %[1]s: HandlerConfig.Lanes 0: Config.Declare lists queue %[1]q with Lanes 4", q))
	err = r.AddConsumerHandler(router.HandlerConfig{Queue: q, Lanes: 4}, func(*message.Message) error { return nil })
	assert.ErrorContains(t, err, fmt.Sprintf("router: handler %[1]s: HandlerConfig.Lanes 4: Config.Declare lists queue %[1]q with Lanes 0", q))
	err = ordered.AddConsumerHandler(router.HandlerConfig{Queue: q, Lanes: 4, Reply: true}, func(*message.Message) error { return nil })
	assert.ErrorContains(t, err, "HandlerConfig.Lanes 4 is set with Exchange or Reply")
	long := strings.Repeat("q", 245) // its lanes fit in 255 bytes, their leases not
	err = ordered.AddConsumerHandler(router.HandlerConfig{Queue: long, Lanes: 10}, func(*message.Message) error { return nil })
	assert.ErrorContains(t, err, "HandlerConfig.Queue is 245 bytes long: with its lanes' leases' suffix it exceeds 255")
	err = ordered.AddConsumerHandler(router.HandlerConfig{Queue: q, Lanes: topology.MaxLanes + 1}, func(*message.Message) error { return nil })
	assert.ErrorContains(t, err, fmt.Sprintf("Lanes %d is outside 0..%d", topology.MaxLanes+1, topology.MaxLanes))
}

// A broker that stops answering on a connection that is up: amqp091's channel calls have no
// deadline, and SubscribeInitialize returned after 15 s (the heartbeat timeout) with a limit
// of 2 s. Declaring (subscriber, publisher, publishing to a new destination) keeps the limit.
func TestTimeLimitsWhenAnOpenConnectionFreezes(t *testing.T) {
	// Not parallel with other tests (its cases are, with each other): it measures wall-clock limits.
	const limit = 2 * time.Second
	env := testenv.New(t)
	calls := map[string]func(url string) (func() error, error){
		"Subscriber.SubscribeInitialize": func(url string) (func() error, error) {
			s, err := consumer.NewSubscriber(consumer.Config{Connection: warren.Connection{URL: url, ConnectTimeout: limit}}, nil)
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { _ = s.Close() })
			q := env.Queue("sub")
			return func() error { return s.SubscribeInitialize(q) }, s.SubscribeInitialize(q)
		},
		"Publisher.Declare": func(url string) (func() error, error) {
			p, err := dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: url, ConnectTimeout: limit}, Topology: topology.Config{Delay: topology.Delay{Disabled: true}}}, nil)
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { _ = p.Close() })
			q := env.Queue("declare")
			return func() error {
				return p.Declare(context.Background(), topology.Topology{Queues: []topology.Queue{{Name: q}}})
			}, nil
		},
		"Publisher.Publish to a new queue": func(url string) (func() error, error) {
			p, err := dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: url}, PublishTimeout: limit, Topology: topology.Config{Delay: topology.Delay{Disabled: true}}}, nil)
			if err != nil {
				return nil, err
			}
			t.Cleanup(func() { _ = p.Close() })
			q := env.Queue("publish")
			return func() error { return p.Publish(q, message.NewMessage("frozen", nil)) }, nil
		},
	}
	for name, setup := range calls {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			proxy, url := testenv.ProxyURL(t, env.URL)
			call, err := setup(url)
			require.NoError(t, err)
			proxy.Freeze()
			start := time.Now()
			err = call()
			testenv.WithinLimit(t, limit, time.Since(start), name)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "gave up after 2s")
		})
	}
}

// notifyDials listens on a free local port and forwards every connection to target
// (host:port), until t ends; it returns its host:port and a channel that gets a value for
// each connection accepted, before anything is forwarded: a client that has finished its
// handshake through it has been counted.
func notifyDials(t *testing.T, target string) (string, <-chan struct{}) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
	dialed := make(chan struct{}, 100)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, u)
			mu.Unlock()
			dialed <- struct{}{}
			go func() { _, _ = io.Copy(u, c); _ = u.Close() }()
			go func() { _, _ = io.Copy(c, u); _ = c.Close() }()
		}
	}()
	return l.Addr().String(), dialed
}
