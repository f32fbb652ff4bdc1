package main

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// benchPublish: confirmed, persistent, 256-byte messages into a durable queue of warren's
// type (quorum by default), every contender on a queue declared alike.
func benchPublish() {
	body := make([]byte, 256)
	fmt.Printf("== publish: %d confirmed persistent 256 B messages per run into a %s queue, %d in flight, median of %d runs\n",
		*publish, queueType(), *window, *rounds)

	delay := config(topology.Delay{Prefix: name("delay"), Levels: 1}).Delay
	defer cleanupDelay(delay)
	cmp := compare("publish", *publish, []contender{
		{"raw amqp091-go", func(q string) (time.Duration, error) { return publishRaw(q, body) }},
		{"warren dlx", func(q string) (time.Duration, error) { return publishWarren(q, *publish, body, delay) }},
		{"watermill-amqp", func(q string) (time.Duration, error) { return publishWatermill(q, body) }},
		{"raw, goroutines", func(q string) (time.Duration, error) { return publishRawGoroutines(q, body) }},
		{"warren batches", func(q string) (time.Duration, error) { return publishWarrenBatches(q, body, delay) }},
	})
	fmt.Printf("   (raw: one goroutine, a window of %[1]d confirmations; warren, watermill-amqp and \"raw, goroutines\": %[1]d goroutines, each publishing one message and waiting for its confirmation; warren batches: one goroutine, Publish(topic, %[1]d messages) at a time)\n", *window)
	result("ratio publish_vs_raw", "%.2f", cmp.ratio(1, 0))
	result("ratio publish_vs_watermill", "%.2f", cmp.ratio(1, 2))
	result("ratio publish_vs_raw_goroutines", "%.2f", cmp.ratio(1, 3))
	result("ratio publish_batch_vs_raw", "%.2f", cmp.ratio(4, 0))
	result("ratio publish_cpu_vs_raw_goroutines", "%.2f", cmp.cpuPerMsg(1)/cmp.cpuPerMsg(3))
	result("ratio publish_allocs_vs_raw", "%.2f", cmp.allocRatio(1, 0))
	result("publish_cpu_us_per_msg_raw", "%.1f", cmp.cpuPerMsg(0))
	result("publish_cpu_us_per_msg_warren", "%.1f", cmp.cpuPerMsg(1))
	result("publish_cpu_us_per_msg_raw_goroutines", "%.1f", cmp.cpuPerMsg(3))
}

// contender is one side of a throughput comparison: run handles n messages on queue.
type contender struct {
	name string
	run  func(queue string) (time.Duration, error)
}

// compare runs every contender *rounds times, interleaved so that drift hits all alike, each
// time on a fresh queue of n messages, and prints, over each run's timed span (see span),
// the median rates, the CPU time this process spent per message, and its allocations and
// allocated bytes per message (the broker's are not counted). On a machine the broker
// shares, the CPU figure is the steadier one: the client's CPU is taken from the broker's.
// With -profile, each contender's first two rounds write its profiles (see span).
func compare(section string, n int, contenders []contender) comparison {
	k := len(contenders)
	cmp := comparison{rates: make([][]float64, k), cpu: make([][]float64, k), allocs: make([][]float64, k), bytes: make([][]float64, k)}
	for r := 0; r < *rounds; r++ {
		for i, c := range contenders {
			q := name("run")
			if r < 2 && *profileDir != "" {
				profileAs = profile{path: profilePath(section, c.name), allocs: r == 1}
			}
			d, err := c.run(q)
			cleanup(testenv.WorkQueueNames(q))
			must(err)
			cmp.rates[i] = append(cmp.rates[i], float64(n)/d.Seconds())
			cmp.cpu[i] = append(cmp.cpu[i], float64(measured.cpu.Microseconds())/float64(n))
			cmp.allocs[i] = append(cmp.allocs[i], float64(measured.mallocs)/float64(n))
			cmp.bytes[i] = append(cmp.bytes[i], float64(measured.bytes)/float64(n))
		}
	}
	for i, c := range contenders {
		fmt.Printf("   %-18s %9.0f msg/s  %5.1f µs CPU/msg  %5.1f allocs/msg  %6.0f B/msg   (runs: %s)\n",
			c.name, median(cmp.rates[i]), cmp.cpuPerMsg(i), median(cmp.allocs[i]), median(cmp.bytes[i]), fmtRates(cmp.rates[i]))
	}
	return cmp
}

// comparison holds, per contender, the rate, the CPU per message, and the allocations and
// allocated bytes per message of every round.
type comparison struct{ rates, cpu, allocs, bytes [][]float64 }

// allocRatio is contender i's median allocations per message over contender j's.
func (c comparison) allocRatio(i, j int) float64 { return median(c.allocs[i]) / median(c.allocs[j]) }

// ratio is the median over the rounds of contender i's rate over contender j's in the same
// round: runs next to each other share the machine's mood, so the ratio is steadier than
// one of medians.
func (c comparison) ratio(i, j int) float64 {
	rs := make([]float64, len(c.rates[i]))
	for r := range rs {
		rs[r] = c.rates[i][r] / c.rates[j][r]
	}
	return median(rs)
}

func (c comparison) cpuPerMsg(i int) float64 { return median(c.cpu[i]) }

// processCPU returns the user and system CPU time this process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	must(syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func fmtRates(rs []float64) string {
	s := ""
	for i, r := range rs {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%.0f", r)
	}
	return s
}

func declareQueue(q string) error {
	conn, ch, err := dialChannel()
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = ch.QueueDeclare(q, true, false, false, false, queueArgs(q))
	return err
}

// confirmChannel connects, declares with declare and returns a channel in confirm mode;
// closing conn closes both.
func confirmChannel(declare func(ch *amqp.Channel) error) (*amqp.Connection, *amqp.Channel, error) {
	conn, ch, err := dialChannel()
	if err != nil {
		return nil, nil, err
	}
	if err := declare(ch); err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	if err := ch.Confirm(false); err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	return conn, ch, nil
}

// publishOne publishes one persistent message of body to queue q, mandatory, as the raw
// contenders do.
func publishOne(ctx context.Context, ch *amqp.Channel, q string, body []byte) (*amqp.DeferredConfirmation, error) {
	return ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, amqp.Publishing{
		Body: body, DeliveryMode: amqp.Persistent, MessageId: watermill.NewUUID(),
	})
}

// publishRaw: one channel in confirm mode, a sliding window of deferred confirmations.
func publishRaw(q string, body []byte) (time.Duration, error) {
	conn, ch, err := confirmChannel(plainQueue(q))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ctx := context.Background()
	inflight := make([]*amqp.DeferredConfirmation, 0, *window)
	w := startSpan()
	for i := 0; i < *publish; i++ {
		dc, err := publishOne(ctx, ch, q, body)
		if err != nil {
			return 0, err
		}
		inflight = append(inflight, dc)
		if len(inflight) == *window {
			if ok, err := inflight[0].WaitContext(ctx); err != nil || !ok {
				return 0, fmt.Errorf("raw: not confirmed: %v", err)
			}
			inflight = inflight[1:]
		}
	}
	for _, dc := range inflight {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return 0, fmt.Errorf("raw: not confirmed: %v", err)
		}
	}
	return w.stop(), nil
}

// parallel runs fn n times from g goroutines and returns the elapsed time.
func parallel(g, n int, fn func() error) (time.Duration, error) {
	var (
		next    atomic.Int64
		wg      sync.WaitGroup
		errOnce sync.Once
		first   error
	)
	w := startSpan()
	for range g {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if err := fn(); err != nil {
					errOnce.Do(func() { first = err })
					return
				}
			}
		})
	}
	wg.Wait()
	return w.stop(), first
}

// publishRawGoroutines: the calling pattern of warren's and watermill-amqp's runs with raw
// amqp091-go: *window goroutines on one confirm channel, each waiting for its own confirmation.
func publishRawGoroutines(q string, body []byte) (time.Duration, error) {
	conn, ch, err := confirmChannel(plainQueue(q))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ctx := context.Background()
	return parallel(*window, *publish, func() error {
		dc, err := publishOne(ctx, ch, q, body)
		if err != nil {
			return err
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("raw, goroutines: not confirmed: %v", err)
		}
		return nil
	})
}

// warrenPublisher returns a publisher of warren's defaults that has declared q (outside the
// timing).
func warrenPublisher(q string, delay topology.Delay) (*dlx.Publisher, error) {
	p, err := dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: *url}, Topology: config(delay)}, nil)
	if err != nil {
		return nil, err
	}
	if err := p.Publish(q); err != nil {
		_ = p.Close()
		return nil, err
	}
	return p, nil
}

// publishWarren publishes n messages to q from *window goroutines, one per Publish call.
func publishWarren(q string, n int, body []byte, delay topology.Delay) (time.Duration, error) {
	p, err := warrenPublisher(q, delay)
	if err != nil {
		return 0, err
	}
	defer p.Close()
	return parallel(*window, n, func() error {
		return p.Publish(q, message.NewMessage(watermill.NewUUID(), body))
	})
}

// publishWarrenBatches: one goroutine publishing *window messages per Publish call, whose
// confirmations are awaited together.
func publishWarrenBatches(q string, body []byte, delay topology.Delay) (time.Duration, error) {
	p, err := warrenPublisher(q, delay)
	if err != nil {
		return 0, err
	}
	defer p.Close()
	w := startSpan()
	batch := make([]*message.Message, 0, *window)
	for sent := 0; sent < *publish; sent += len(batch) {
		batch = batch[:0]
		for i := 0; i < min(*window, *publish-sent); i++ {
			batch = append(batch, message.NewMessage(watermill.NewUUID(), body))
		}
		if err := p.Publish(q, batch...); err != nil {
			return 0, err
		}
	}
	return w.stop(), nil
}

func publishWatermill(q string, body []byte) (time.Duration, error) {
	if err := declareQueue(q); err != nil {
		return 0, err
	}
	cfg := wamqp.NewDurableQueueConfig(firstNode())
	cfg.Publish.ConfirmDelivery = true
	cfg.Publish.ChannelPoolSize = *window
	cfg.Marshaler = warren.Marshaler{}
	p, err := wamqp.NewPublisher(cfg, watermill.NopLogger{})
	if err != nil {
		return 0, err
	}
	defer p.Close()
	return parallel(*window, *publish, func() error {
		return p.Publish(q, message.NewMessage(watermill.NewUUID(), body))
	})
}

func cleanupDelay(d topology.Delay) { cleanup(d.Names()) }
