package main

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/middleware/redisstore"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// benchConsume: how fast each contender drains a queue holding *consume messages.
func benchConsume() {
	fmt.Printf("== consume: %d persistent 256 B messages per run from a %s queue, acked one by one, median of %d runs\n",
		*consume, queueType(), *rounds)
	delay := config(topology.Delay{Prefix: name("delay")}).Delay
	defer cleanupDelay(delay)
	want := func(c string) bool { return *consumers == "" || strings.Contains(","+*consumers+",", ","+c+",") }

	var copies, idemRedis middleware.IdempotencyStore
	if want("copystore") || want("idem-redis") {
		rdb := redis.NewClient(&redis.Options{Addr: *redisAddr})
		defer rdb.Close()
		prefix := "warren:bench:" + name("copies") + ":"
		defer deleteKeys(rdb, prefix)
		store, err := redisstore.New(redisstore.Config{Client: rdb, Prefix: prefix}, nil)
		must(err)
		defer store.Close()
		copies, idemRedis = store, store // the keys differ: CopyKey's are publish ids, MessageIDKey's message ids
	}

	var contenders []contender
	index := map[string]int{}
	for _, c := range []struct {
		key string
		contender
	}{
		{"raw", contender{"raw amqp091-go", consumeRaw}},
		{"warren", contender{"warren router", func(q string) (time.Duration, error) { return consumeWarren(q, delay, warrenOptions{}) }}},
		{"watermill", contender{"watermill-amqp", consumeWatermill}},
		{"copystore", contender{"warren+CopyStore", func(q string) (time.Duration, error) {
			return consumeWarren(q, delay, warrenOptions{copies: copies})
		}}},
		{"metrics", contender{"warren+metrics", consumeWarrenMetrics(delay)}},
		{"idem-memory", contender{"warren+idem(mem)", func(q string) (time.Duration, error) {
			store, err := middleware.NewMemoryStore(0) // one per run, as one process has it
			if err != nil {
				return 0, err
			}
			return consumeWarrenIdempotent(q, delay, store)
		}}},
		{"idem-redis", contender{"warren+idem(Redis)", func(q string) (time.Duration, error) {
			return consumeWarrenIdempotent(q, delay, idemRedis)
		}}},
		{"handlers20", contender{"warren 20 handlers", func(q string) (time.Duration, error) {
			return consumeWarrenHandlers(q, delay, 20)
		}}},
	} {
		if want(c.key) {
			index[c.key] = len(contenders)
			contenders = append(contenders, c.contender)
		}
	}
	cmp := compare("consume", *consume, contenders)
	fmt.Printf("   (raw: prefetch 256; warren: default chain and concurrency 64, tracing into an SDK provider with a discarding exporter, metrics into the global MeterProvider, a no-op; watermill-amqp: default router and config, prefetch 1; warren+CopyStore: warren with router.Config.CopyStore in the Redis at %s; warren+metrics: warren with router.Config.MeterProvider an SDK MeterProvider read by a ManualReader, collected once per run; warren+idem: warren with middleware.Idempotent keyed by MessageIDKey in the handler's Middleware, on a MemoryStore (mem) or a redisstore.Store in the same Redis; warren 20 handlers: the same messages spread over 20 queues, one handler each in one router, which consumes them all on one connection)\n", *redisAddr)
	line := func(name, a, b string, of func(i, j int) float64) {
		i, okA := index[a]
		j, okB := index[b]
		if okA && okB {
			result("ratio "+name, "%.2f", of(i, j))
		}
	}
	ratio := func(name, a, b string) { line(name, a, b, cmp.ratio) }
	ratio("consume_vs_raw", "warren", "raw")
	ratio("consume_vs_watermill", "warren", "watermill")
	line("consume_allocs_vs_raw", "warren", "raw", cmp.allocRatio)
	ratio("consume_copystore_vs_warren", "copystore", "warren")
	ratio("consume_metrics_vs_raw", "metrics", "raw")
	ratio("consume_metrics_vs_warren", "metrics", "warren")
	ratio("consume_idem_memory_vs_warren", "idem-memory", "warren")
	ratio("consume_idem_redis_vs_warren", "idem-redis", "warren")
	ratio("consume_20handlers_vs_warren", "handlers20", "warren")
	ratio("consume_20handlers_vs_raw", "handlers20", "raw")
}

// consumeWarrenMetrics is consumeWarren with metrics recorded into an SDK MeterProvider, as a
// service exporting them would: every instrument aggregates on the hot path, and a reader
// collects them (once per run here; a Prometheus scrape every 15 s is no more).
func consumeWarrenMetrics(delay topology.Delay) func(q string) (time.Duration, error) {
	return func(q string) (time.Duration, error) {
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		defer func() { _ = mp.Shutdown(context.Background()) }()
		d, err := consumeWarren(q, delay, warrenOptions{mp: mp})
		if err != nil {
			return d, err
		}
		var rm metricdata.ResourceMetrics
		return d, reader.Collect(context.Background(), &rm)
	}
}

// deleteKeys deletes the Redis keys that start with prefix.
func deleteKeys(rdb *redis.Client, prefix string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, prefix+"*", 10000).Iterator()
	var keys []string
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
		if len(keys) == 10000 {
			rdb.Del(ctx, keys...)
			keys = keys[:0]
		}
	}
	if len(keys) > 0 {
		rdb.Del(ctx, keys...)
	}
}

// fill publishes *consume messages to queue (declared by declare) with pipelined confirms,
// each with a publish id (contract.PublishIDHeader) as warren's publisher gives it.
func fill(queue string, declare func(ch *amqp.Channel) error) error {
	return fillN(queue, *consume, declare)
}

// fillN is fill with n messages.
func fillN(queue string, n int, declare func(ch *amqp.Channel) error) error {
	conn, ch, err := confirmChannel(declare)
	if err != nil {
		return err
	}
	defer conn.Close()
	body := make([]byte, 256)
	var last *amqp.DeferredConfirmation
	for i := 0; i < n; i++ {
		id := watermill.NewUUID()
		last, err = ch.PublishWithDeferredConfirmWithContext(context.Background(), "", queue, false, false, amqp.Publishing{
			Body: body, DeliveryMode: amqp.Persistent, MessageId: id,
			Headers: amqp.Table{contract.PublishIDHeader: id},
		})
		if err != nil {
			return err
		}
	}
	if ok := last.Wait(); !ok {
		return fmt.Errorf("fill: not confirmed")
	}
	return nil
}

// plainQueue declares queue with warren's arguments (see queueArgs), and nothing else.
func plainQueue(queue string) func(ch *amqp.Channel) error {
	return func(ch *amqp.Channel) error {
		_, err := ch.QueueDeclare(queue, true, false, false, false, queueArgs(queue))
		return err
	}
}

func consumeRaw(queue string) (time.Duration, error) {
	if err := fill(queue, plainQueue(queue)); err != nil {
		return 0, err
	}
	conn, ch, err := dialChannel()
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	if err := ch.Qos(256, 0, false); err != nil {
		return 0, err
	}
	w := startSpan()
	deliveries, err := ch.Consume(queue, "", false, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	for i := 0; i < *consume; i++ {
		d := <-deliveries
		if err := d.Ack(false); err != nil {
			return 0, err
		}
	}
	return w.stop(), nil
}

// discard is a span exporter that drops what it gets: the spans are made, batched and
// handed over as in production, then thrown away.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

// consumeWarrenIdempotent is consumeWarren with the handler guarded by middleware.Idempotent
// keyed by middleware.MessageIDKey on store, where a service puts it (the handler's own
// Middleware): every message is new, so each costs a claim and a done.
func consumeWarrenIdempotent(queue string, delay topology.Delay, store middleware.IdempotencyStore) (time.Duration, error) {
	once, err := middleware.NewIdempotent(middleware.IdempotentConfig{Store: store, Key: middleware.MessageIDKey}, nil)
	if err != nil {
		return 0, err
	}
	return consumeWarren(queue, delay, warrenOptions{middleware: []message.HandlerMiddleware{once.Middleware}})
}

// warrenOptions are what the warren contenders add to the plain router.
type warrenOptions struct {
	copies     middleware.IdempotencyStore // router.Config.CopyStore
	mp         metric.MeterProvider        // router.Config.MeterProvider
	middleware []message.HandlerMiddleware // router.HandlerConfig.Middleware
	noTracer   bool                        // no router.Config.TracerProvider: the global one, a no-op
}

func consumeWarren(queue string, delay topology.Delay, opts warrenOptions) (time.Duration, error) {
	tcfg := config(delay)
	b, err := topology.NewBuilder(tcfg, nil)
	if err != nil {
		return 0, err
	}
	if err := fill(queue, func(ch *amqp.Channel) error {
		return b.DeclareQueue(context.Background(), ch, topology.Queue{Name: queue})
	}); err != nil {
		return 0, err
	}
	rcfg := router.Config{Connection: warren.Connection{URL: *url}, Topology: tcfg, CopyStore: opts.copies, MeterProvider: opts.mp}
	if !opts.noTracer {
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}))
		defer func() { _ = tp.Shutdown(context.Background()) }()
		rcfg.TracerProvider = tp
	}
	r, err := router.New(rcfg, nil)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	return drain(r, []string{queue}, opts.middleware, *consume, nil)
}

// drain runs r with a handler on each of queues (mw inside the default chain) until they
// have handled total messages in all, and returns how long that took. The handler does work
// (when not nil) with each message first; a message whose work fails is not counted.
func drain(r *router.Router, queues []string, mw []message.HandlerMiddleware, total int,
	work func(*message.Message) error) (time.Duration, error) {
	var n atomic.Int64
	done := make(chan struct{})
	for _, q := range queues {
		err := r.AddConsumerHandler(router.HandlerConfig{Queue: q, Middleware: mw}, func(msg *message.Message) error {
			if work != nil {
				if err := work(msg); err != nil {
					return err
				}
			}
			if n.Add(1) == int64(total) {
				close(done)
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
	}
	w := startSpan()
	go func() { _ = r.Run(context.Background()) }()
	<-done
	return w.stop(), nil
}

// consumeWarrenHandlers is consumeWarren with the *consume messages spread over handlers
// queues (named after queue), one handler each (the default chain and concurrency) in one
// router: its handlers share the router's consuming connection, a channel each.
func consumeWarrenHandlers(queue string, delay topology.Delay, handlers int) (time.Duration, error) {
	tcfg := config(delay)
	b, err := topology.NewBuilder(tcfg, nil)
	if err != nil {
		return 0, err
	}
	queues := make([]string, handlers)
	defer func() {
		for _, q := range queues {
			cleanup(testenv.WorkQueueNames(q))
		}
	}()
	for i := range queues {
		queues[i] = fmt.Sprintf("%s.h%02d", queue, i)
		n := *consume / handlers
		if i < *consume%handlers {
			n++
		}
		if err := fillN(queues[i], n, func(ch *amqp.Channel) error {
			return b.DeclareQueue(context.Background(), ch, topology.Queue{Name: queues[i]})
		}); err != nil {
			return 0, err
		}
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	r, err := router.New(router.Config{Connection: warren.Connection{URL: *url}, Topology: tcfg, TracerProvider: tp}, nil)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	return drain(r, queues, nil, *consume, nil)
}

func consumeWatermill(queue string) (time.Duration, error) {
	if err := fill(queue, plainQueue(queue)); err != nil {
		return 0, err
	}
	cfg := wamqp.NewDurableQueueConfig(firstNode())
	cfg.Queue.Arguments = queueArgs(queue)
	sub, err := wamqp.NewSubscriber(cfg, watermill.NopLogger{})
	if err != nil {
		return 0, err
	}
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return 0, err
	}
	var n atomic.Int64
	done := make(chan struct{})
	r.AddConsumerHandler("bench", queue, sub, func(msg *message.Message) error {
		if n.Add(1) == int64(*consume) {
			close(done)
		}
		return nil
	})
	w := startSpan()
	go func() { _ = r.Run(context.Background()) }()
	<-done
	elapsed := w.stop()
	return elapsed, r.Close()
}
