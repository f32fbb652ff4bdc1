// Command idempotency shows middleware.Idempotent with the Redis store: five orders are each
// published twice (two publishes of one message id, as a producer that timed out and sent
// again makes them), to a queue consumed by two routers, as if by two processes, which share
// one Redis. Each order is charged once: the copy that arrives second, in either router, waits
// while the other processes it and is then acked without being handled. It prints what
// happened to every copy, and the counts.
//
//	go run ./examples/idempotency
//
// The broker is $WARREN_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/), Redis
// $WARREN_REDIS_ADDR (default 127.0.0.1:6379).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/middleware/redisstore"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

const (
	queue  = "warren.example.idempotency"
	orders = 5
)

func main() {
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), "Usage: go run ./examples/idempotency\n\n"+
			"Publish five orders twice each to a queue that two routers sharing one Redis consume, and show\n"+
			"that each is charged once. Redis is $WARREN_REDIS_ADDR (default 127.0.0.1:6379).\n"+
			"The broker is $WARREN_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/).\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	url := envOr("WARREN_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	redisAddr := envOr("WARREN_REDIS_ADDR", "127.0.0.1:6379")
	if err := run(url, redisAddr); err != nil {
		fmt.Fprintln(os.Stderr, "idempotency:", err)
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// outcome is what happened to one copy in one router.
type outcome struct {
	router, order, copy string
	processed           bool
	err                 error
	took                time.Duration
}

type calledKey struct{}

func run(url, redisAddr string) error {
	// A key prefix of this run's own: the orders of an earlier run (remembered for the
	// retention, 10 minutes by default) are not this run's.
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	prefix := "warren:example:idempotency:" + hex.EncodeToString(b) + ":"

	outcomes := make(chan outcome, 4*orders)
	var routers []*router.Router
	var closers []func()
	defer func() {
		for _, r := range routers {
			_ = r.Close()
		}
		for _, c := range closers {
			c()
		}
		cleanup(url, redisAddr, prefix)
	}()
	for _, name := range []string{"A", "B"} {
		r, closeStore, err := newRouter(url, redisAddr, prefix, name, outcomes)
		if err != nil {
			return err
		}
		routers, closers = append(routers, r), append(closers, closeStore)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, r := range routers {
		go func() { _ = r.Run(ctx) }()
	}
	for _, r := range routers {
		select {
		case <-r.Running():
		case <-time.After(time.Minute):
			return errors.New("the routers do not consume after a minute")
		}
	}
	fmt.Printf("routers A and B consume %s, sharing the Redis at %s (keys %s*)\n", queue, redisAddr, prefix)

	pub := routers[0].Publisher()
	for i := 1; i <= orders; i++ {
		id := fmt.Sprintf("order-%d", i)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for c := range 2 { // two publishes of one message id, at once
			wg.Go(func() {
				msg := message.NewMessage(id, []byte(fmt.Sprintf(`{"order":%q,"amount":"%d.00"}`, id, 10*i)))
				msg.Metadata.Set("copy", fmt.Sprint(c+1))
				errs[c] = pub.Publish(queue, msg)
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	fmt.Printf("published %d orders twice each: %d messages, two per message id\n\n", orders, 2*orders)

	processed, skipped := 0, 0
	by := map[string]int{}
	timeout := time.After(time.Minute)
	for range 2 * orders {
		select {
		case o := <-outcomes:
			switch {
			case o.err != nil:
				fmt.Printf("router %s: %s copy %s  not settled: %v\n", o.router, o.order, o.copy, o.err)
			case o.processed:
				processed++
				by[o.router]++
				fmt.Printf("router %s: %s copy %s  processed: charged\n", o.router, o.order, o.copy)
			default:
				skipped++
				waited := ""
				if o.took > 5*time.Millisecond {
					waited = fmt.Sprintf(", after waiting %s for the other copy", o.took.Round(time.Millisecond))
				}
				fmt.Printf("router %s: %s copy %s  skipped: processed already%s\n", o.router, o.order, o.copy, waited)
			}
		case <-timeout:
			return errors.New("not every copy was settled within a minute")
		}
	}
	fmt.Printf("\n%d orders, %d deliveries: %d processed (router A %d, router B %d), %d skipped as processed already\n",
		orders, 2*orders, processed, by["A"], by["B"], skipped)
	if processed != orders {
		return fmt.Errorf("%d orders processed, want %d", processed, orders)
	}
	return nil
}

// newRouter returns a router (one process of the service) whose handler is guarded by
// middleware.Idempotent keyed by the message id, in a Redis store of its own on the shared
// Redis; what happens to every copy goes to outcomes. closeStore closes the store and its
// client, once the router is closed.
func newRouter(url, redisAddr, prefix, name string, outcomes chan<- outcome) (r *router.Router, closeStore func(), err error) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	store, err := redisstore.New(redisstore.Config{Client: rdb, Prefix: prefix}, nil)
	if err != nil {
		_ = rdb.Close()
		return nil, nil, err
	}
	closeStore = func() {
		_ = store.Close()
		_ = rdb.Close()
	}
	once, err := middleware.NewIdempotent(middleware.IdempotentConfig{Store: store, Key: middleware.MessageIDKey}, nil)
	if err != nil {
		closeStore()
		return nil, nil, err
	}
	r, err = router.New(router.Config{Connection: warren.Connection{URL: url}}, watermill.NopLogger{})
	if err != nil {
		closeStore()
		return nil, nil, fmt.Errorf("router %s: %w", name, err)
	}
	// report, outside the guard, tells what became of each copy.
	report := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			called := new(bool)
			msg.SetContext(context.WithValue(msg.Context(), calledKey{}, called))
			start := time.Now()
			out, err := h(msg)
			outcomes <- outcome{router: name, order: msg.UUID, copy: msg.Metadata.Get("copy"), processed: *called && err == nil, err: err, took: time.Since(start)}
			return out, err
		}
	}
	err = r.AddConsumerHandler(router.HandlerConfig{
		Queue:      queue,
		Middleware: []message.HandlerMiddleware{report, once.Middleware},
	}, func(msg *message.Message) error {
		*msg.Context().Value(calledKey{}).(*bool) = true
		time.Sleep(200 * time.Millisecond) // charging: the other copy arrives meanwhile
		return nil
	})
	if err != nil {
		_ = r.Close()
		closeStore()
		return nil, nil, fmt.Errorf("router %s: %w", name, err)
	}
	return r, closeStore, nil
}

// cleanup removes the example's queue (the delay levels stay, as in production) and its
// Redis keys.
func cleanup(url, redisAddr, prefix string) {
	if conn, err := amqp.Dial(firstNode(url)); err == nil {
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(queue, false, false, false)
			_, _ = ch.QueueDelete(topology.PoisonQueue(queue), false, false, false)
			_ = ch.ExchangeDelete(topology.KillExchange(queue), false, false)
		}
		_ = conn.Close()
	}
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
}

// firstNode is the first URL of a list of a cluster's nodes (warren's components take the
// whole list; amqp091's Dial one URL).
func firstNode(url string) string {
	first, _, _ := strings.Cut(url, ",")
	return first
}
