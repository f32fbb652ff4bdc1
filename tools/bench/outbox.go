package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/outbox"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

var (
	pgURL      = flag.String("postgres", testenv.PostgresURL(), "outbox section: PostgreSQL URL")
	outboxN    = flag.Int("outbox-messages", 5000, "outbox section: messages per relay and inbox run")
	outboxRate = flag.Int("outbox-rate", 1000, "outbox section: transactions a second in the latency run")
	outboxFor  = flag.Duration("outbox-for", 10*time.Second, "outbox section: length of the latency run")
	relayBatch = flag.Int("outbox-batch", outbox.DefaultBatchSize, "outbox section: the relay's RelayConfig.BatchSize")
	fwdPool    = flag.Int("forwarder-channel-pool", 0, "outbox section: the Forwarder's watermill-amqp Publish.ChannelPoolSize (0, its default: a channel opened and closed per Publish)")
)

// benchOutbox: the relay against warren's direct publish and against Watermill's Forwarder
// over watermill-sql, the latency from commit to the broker's confirm at a steady rate of
// transactions through each, and a consumer writing one row per message in the inbox's
// transaction against the same consumer writing it without.
func benchOutbox() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(*pgURL)
	must(err)
	cfg.MaxConns = 32
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	must(err)
	defer pool.Close()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	schema := "warren_bench_" + hex.EncodeToString(b)
	must(outbox.Migrate(ctx, pool, schema))
	defer pool.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck // best effort
	delay := config(topology.Delay{Prefix: name("delay"), Levels: 1}).Delay
	defer cleanupDelay(delay)
	body := make([]byte, 256)

	wm, err := newWatermillOutbox(ctx, pool, "watermill_bench_"+hex.EncodeToString(b))
	must(err)
	defer wm.drop(ctx)

	fmt.Printf("== outbox: %d confirmed persistent 256 B messages per run into a %s queue, median of %d runs\n",
		*outboxN, queueType(), *rounds)
	cmp := compare("outbox", *outboxN, []contender{
		{"warren dlx", func(q string) (time.Duration, error) { return publishWarren(q, *outboxN, body, delay) }},
		{"outbox relay", func(q string) (time.Duration, error) { return relayRun(pool, schema, q, body, delay) }},
		{"wm Forwarder", func(q string) (time.Duration, error) { return forwarderRun(wm, q, body) }},
	})
	fmt.Printf("   (warren dlx: %d goroutines publishing one message each; outbox relay: one relay running, the rows written in one transaction, then from its commit until the relay, %d per Publish, has deleted them all; wm Forwarder: Watermill's Forwarder on watermill-sql's DefaultPostgreSQLSchema and DefaultPostgreSQLOffsetsAdapter and watermill-amqp with ConfirmDelivery and ChannelPoolSize %d, their defaults otherwise, the rows written and committed beforehand, then one Forwarder publishing them until their last offset is recorded)\n",
		*window, *relayBatch, *fwdPool)
	result("ratio outbox_relay_vs_publish", "%.2f", cmp.ratio(1, 0))
	result("ratio outbox_vs_watermill_forwarder", "%.2f", cmp.ratio(1, 2))
	result("outbox_forwarder_msgs_per_sec", "%.0f", median(cmp.rates[2]))

	outboxLatency(ctx, pool, schema, body, delay)
	forwarderLatency(ctx, wm, body)

	fmt.Printf("== inbox: %d messages per run, a handler writing one row each (default concurrency), median of %d runs\n", *outboxN, *rounds)
	cmp = compare("inbox", *outboxN, []contender{
		{"plain db write", func(q string) (time.Duration, error) { return consumeDB(pool, schema, q, delay, false) }},
		{"inbox", func(q string) (time.Duration, error) { return consumeDB(pool, schema, q, delay, true) }},
	})
	result("ratio inbox_vs_plain_db", "%.2f", cmp.ratio(1, 0))
}

// relayRun starts a relay, writes *outboxN rows to topic q in one transaction (outside the
// timing), then times its commit and the relay moving them to the broker until the outbox is
// empty.
func relayRun(pool *pgxpool.Pool, schema, q string, body []byte, delay topology.Delay) (time.Duration, error) {
	ctx := context.Background()
	p, err := warrenPublisher(q, delay)
	if err != nil {
		return 0, err
	}
	defer p.Close()
	box, err := outbox.New(outbox.Config{Schema: schema}, nil)
	if err != nil {
		return 0, err
	}
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: p, Schema: schema, BatchSize: *relayBatch}, nil)
	if err != nil {
		return 0, err
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	// The relay runs and holds the outbox before the rows come, as in a service.
	for {
		s, err := outbox.ReadStats(ctx, pool, schema)
		if err != nil {
			return 0, err
		}
		if s.Leading {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after the commit: nothing to roll back
	for written := 0; written < *outboxN; written += 1000 {
		msgs := make([]*message.Message, min(1000, *outboxN-written))
		for i := range msgs {
			msgs[i] = message.NewMessage(watermill.NewUUID(), body)
		}
		if err := box.Publish(ctx, tx, q, msgs...); err != nil {
			return 0, err
		}
	}
	w := startSpan()
	if err := tx.Commit(ctx); err != nil {
		return 0, err
	}
	for { // a cheap look, every 5 ms, for the last row to go
		var left bool
		if err := pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+schema+".outbox)").Scan(&left); err != nil {
			stop()
			return 0, err
		}
		if !left {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	d := w.stop()
	stop()
	return d, <-done
}

// confirmTimes records when the broker confirmed each message a relay published.
type confirmTimes struct {
	message.Publisher
	mu sync.Mutex
	at map[string]time.Time
}

func (c *confirmTimes) Publish(topic string, msgs ...*message.Message) error {
	if err := c.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	now := time.Now()
	c.mu.Lock()
	for _, m := range msgs {
		if _, ok := c.at[m.UUID]; !ok {
			c.at[m.UUID] = now
		}
	}
	c.mu.Unlock()
	return nil
}

// outboxLatency runs commitLatency with a relay running, and prints the time from each
// commit to the broker's confirm of its message.
func outboxLatency(ctx context.Context, pool *pgxpool.Pool, schema string, body []byte, delay topology.Delay) {
	q := name("latency")
	defer cleanup(testenv.WorkQueueNames(q))
	p, err := warrenPublisher(q, delay)
	must(err)
	defer p.Close()
	confirmed := &confirmTimes{Publisher: p, at: map[string]time.Time{}}
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: confirmed, Schema: schema}, nil)
	must(err)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()
	box, err := outbox.New(outbox.Config{Schema: schema}, nil)
	must(err)
	l := commitLatency(ctx, pool, confirmed, func(tx pgx.Tx, id string) error {
		return box.Publish(ctx, tx, q, message.NewMessage(id, body))
	})
	stop()
	must(<-done)
	if l.print("outbox latency") {
		result("outbox_latency_p50_ms", "%.1f", percentile(l.ms, 0.5))
		result("outbox_latency_p99_ms", "%.1f", percentile(l.ms, 0.99))
	}
}

// forwarderLatency runs commitLatency with Watermill's Forwarder running, and prints the
// time from each commit to the broker's confirm of its message.
func forwarderLatency(ctx context.Context, w *watermillOutbox, body []byte) {
	q := name("forwarder-latency")
	defer cleanup(testenv.WorkQueueNames(q))
	topic := q
	must(w.init(topic))
	p, err := watermillAMQPPublisher(q)
	must(err)
	defer p.Close()
	confirmed := &confirmTimes{Publisher: p, at: map[string]time.Time{}}
	f, sub, err := w.forwarder(topic, confirmed)
	must(err)
	defer sub.Close()
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	<-f.Running()
	l := commitLatency(ctx, w.pool, confirmed, func(tx pgx.Tx, id string) error {
		return w.publishTx(tx, topic, q, message.NewMessage(id, body))
	})
	must(f.Close())
	must(<-done)
	if l.print("forwarder latency") {
		result("forwarder_latency_p50_ms", "%.1f", percentile(l.ms, 0.5))
		result("forwarder_latency_p99_ms", "%.1f", percentile(l.ms, 0.99))
	}
}

// latency is what commitLatency measured.
type latency struct {
	total, committed int
	failed           int64
	elapsed          time.Duration
	ms               []float64 // commit to confirm, sorted
}

// commitLatency commits *outboxRate transactions a second, each one message written by
// write, for *outboxFor, waits for confirmed to have seen every committed message (or for a
// minute without a confirm), and returns the time from each commit to its confirm.
func commitLatency(ctx context.Context, pool *pgxpool.Pool, confirmed *confirmTimes, write func(tx pgx.Tx, id string) error) latency {
	var (
		mu        sync.Mutex
		committed = map[string]time.Time{}
		wg        sync.WaitGroup
		failed    atomic.Int64
		sem       = make(chan struct{}, 32)
	)
	total := int(outboxFor.Seconds() * float64(*outboxRate))
	start := time.Now()
	for i := range total {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / time.Duration(*outboxRate))))
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			id := watermill.NewUUID()
			tx, err := pool.Begin(ctx)
			if err == nil {
				err = write(tx, id)
				if err == nil {
					err = tx.Commit(ctx)
				} else {
					_ = tx.Rollback(ctx)
				}
			}
			if err != nil {
				failed.Add(1)
				return
			}
			now := time.Now()
			mu.Lock()
			committed[id] = now
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	// wait for the confirms until a minute passes without one
	for seen, deadline := 0, time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		confirmed.mu.Lock()
		k := len(confirmed.at)
		confirmed.mu.Unlock()
		if k >= len(committed) {
			break
		}
		if k > seen {
			seen, deadline = k, time.Now().Add(time.Minute)
		}
	}
	l := latency{total: total, committed: len(committed), failed: failed.Load(), elapsed: elapsed}
	confirmed.mu.Lock()
	for id, c := range committed {
		if at, ok := confirmed.at[id]; ok {
			l.ms = append(l.ms, float64(at.Sub(c).Microseconds())/1000)
		}
	}
	confirmed.mu.Unlock()
	slices.Sort(l.ms)
	return l
}

// print prints the figures under title and reports whether any message was confirmed.
func (l latency) print(title string) bool {
	fmt.Printf("== %s: %d transactions of one message at %d/s asked (%.0f/s achieved, %d failed), commit to the broker's confirm:\n",
		title, l.total, *outboxRate, float64(l.committed)/l.elapsed.Seconds(), l.failed)
	if len(l.ms) == 0 {
		fmt.Println("   no message confirmed")
		return false
	}
	fmt.Printf("   p50 %.1f ms  p99 %.1f ms  max %.1f ms  (%d of %d confirmed)\n",
		percentile(l.ms, 0.5), percentile(l.ms, 0.99), l.ms[len(l.ms)-1], len(l.ms), l.committed)
	return true
}

// consumeDB fills q with *outboxN messages, then times a router whose handler writes one
// row per message: in the inbox's transaction, or with a plain statement.
func consumeDB(pool *pgxpool.Pool, schema, q string, delay topology.Delay, inbox bool) (time.Duration, error) {
	ctx := context.Background()
	tcfg := config(delay)
	b, err := topology.NewBuilder(tcfg, nil)
	if err != nil {
		return 0, err
	}
	if err := fillN(q, *outboxN, func(ch *amqp.Channel) error {
		return b.DeclareQueue(ctx, ch, topology.Queue{Name: q})
	}); err != nil {
		return 0, err
	}
	tbl := schema + ".effects_" + fmt.Sprint(time.Now().UnixNano())
	if _, err := pool.Exec(ctx, "CREATE TABLE "+tbl+" (uuid text NOT NULL)"); err != nil {
		return 0, err
	}
	r, err := router.New(router.Config{Connection: warren.Connection{URL: *url}, Topology: tcfg}, nil)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	var mw []message.HandlerMiddleware
	write := func(msg *message.Message) error {
		_, err := pool.Exec(msg.Context(), "INSERT INTO "+tbl+" VALUES ($1)", msg.UUID)
		return err
	}
	if inbox {
		in, err := outbox.NewInbox(outbox.InboxConfig{Pool: pool, Schema: schema}, nil)
		if err != nil {
			return 0, err
		}
		defer in.Close()
		mw = []message.HandlerMiddleware{in.Middleware}
		write = func(msg *message.Message) error {
			tx, _ := outbox.TxFrom(msg.Context())
			_, err := tx.Exec(msg.Context(), "INSERT INTO "+tbl+" VALUES ($1)", msg.UUID)
			return err
		}
	}
	return drain(r, []string{q}, mw, *outboxN, write)
}
