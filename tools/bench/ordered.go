package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

var (
	orderedMessages = flag.Int("ordered-messages", 100000, "ordered section: messages drained per run by the ordered contender and the plain router (0: no rate runs)")
	orderedRate     = flag.Int("ordered-rate", 500, "ordered section: messages published per second")
	orderedFor      = flag.Duration("ordered-for", 60*time.Second, "ordered section: how long the load runs, and one key fails")
)

// The keys and lanes of the ordered section's queues, and its held key.
const (
	orderedKeys  = 2000
	orderedLanes = 8
	heldKey      = "k0000"
	isoRetryGap  = time.Second
	// isoWait is how long a run waits, after its load, for the messages still on their way.
	isoWait = 30 * time.Second
)

// isolation is what one run of the ordered section saw of the keys other than heldKey.
type isolation struct {
	p99      time.Duration // from publish to handled
	laneRate float64       // handled per second, of the keys in heldKey's lane
	handled  int
}

// benchOrdered measures how much one key failing for the whole run holds the others: the
// p99 latency of the other keys on a queue ordered by key with and without the failing key,
// and the rate of the keys that share its lane, against the usual recipe (a queue with a
// single active consumer per hash of the key, handled one message at a time, where a failure
// holds everything behind it); then the rate of a queue ordered by key against the plain
// router's (benchOrderedRate).
func benchOrdered() {
	fmt.Printf("== ordered: %d msg/s of %d keys for %s over %d lanes; one key (%s) failing the whole run, retried every %s\n",
		*orderedRate, orderedKeys, *orderedFor, orderedLanes, heldKey, isoRetryGap)
	// Without and with the failing key at once, each on a queue and router of its own: what
	// else the machine does at the time moves both alike, and their ratio is the key's.
	var (
		base, held       isolation
		baseErr, heldErr error
		gate, done       sync.WaitGroup
	)
	gate.Add(2)
	together := func() func() { return sync.OnceFunc(func() { gate.Done(); gate.Wait() }) }
	done.Go(func() { base, baseErr = orderedIsolation(false, false, together()) })
	done.Go(func() { held, heldErr = orderedIsolation(true, false, together()) })
	done.Wait()
	must(baseErr)
	must(heldErr)
	recipe, err := orderedIsolation(true, true, func() {})
	must(err)
	for _, r := range []struct {
		name string
		iso  isolation
	}{{"lanes, no key failing", base}, {"lanes, one key failing", held}, {"recipe, one key failing", recipe}} {
		fmt.Printf("   %-26s other keys p99 %6.1f ms   its lane's other keys %6.1f msg/s   (%d handled)\n",
			r.name, float64(r.iso.p99.Microseconds())/1000, r.iso.laneRate, r.iso.handled)
	}
	result("ratio ordered_other_keys_p99", "%.2f", float64(held.p99)/float64(base.p99))
	// The recipe's lane may handle nothing while the key is held: counted as one message.
	result("ratio ordered_vs_sac_recipe", "%.1f", held.laneRate/max(recipe.laneRate, 1/orderedFor.Seconds()))
	if *orderedMessages > 0 { // after: what the broker does after its heavy runs must not move the latencies above
		benchOrderedRate()
	}
}

// orderedIsolation runs the load once: on a queue ordered by key (or, recipe, on orderedLanes
// queues with a single active consumer, one handler each with Concurrency 1), heldKey failing
// every attempt when held. It calls arrive once its handlers run, and starts the load when
// arrive returns (or returns its error having called arrive).
func orderedIsolation(held, recipe bool, arrive func()) (isolation, error) {
	defer arrive()
	queue := name("ordered")
	delay := config(topology.Delay{Prefix: name("delay"), Levels: 1}).Delay
	defer cleanupDelay(delay)
	top := topology.Topology{Queues: []topology.Queue{{Name: queue, Lanes: orderedLanes}}}
	names := []string{router.MembersQueue(queue), topology.HeldState(queue)}
	for i := range orderedLanes {
		names = append(names, topology.LaneQueue(queue, i), topology.HeldQueue(queue, i))
	}
	defer cleanup(names, nil)
	if recipe {
		top.Queues = nil
		for i := range orderedLanes {
			top.Queues = append(top.Queues, topology.Queue{Name: topology.LaneQueue(queue, i), Args: map[string]any{"x-single-active-consumer": true}})
		}
	}
	defer func() {
		for _, q := range top.Queues {
			cleanup(testenv.WorkQueueNames(q.Name))
		}
		cleanup(testenv.WorkQueueNames(queue))
	}()
	r, err := router.New(router.Config{Connection: warren.Connection{URL: *url}, Topology: config(delay), Declare: top}, nil)
	if err != nil {
		return isolation{}, err
	}
	defer r.Close()

	var (
		mu        sync.Mutex
		latencies []time.Duration
		laneCount int
		counting  = true
	)
	heldLane := topology.Lane(heldKey, orderedLanes)
	handle := func(msg *message.Message) error {
		key := warren.OrderKey(msg)
		if held && key == heldKey {
			return errors.New("held: this key fails")
		}
		lat := time.Since(time.Unix(0, int64(binary.BigEndian.Uint64(msg.Payload))))
		mu.Lock()
		defer mu.Unlock()
		latencies = append(latencies, lat)
		if counting && topology.Lane(key, orderedLanes) == heldLane {
			laneCount++
		}
		return nil
	}
	retry := &middleware.BackoffConfig{Delays: []time.Duration{isoRetryGap}, MaxAttempts: 1 << 20, InPlace: true}
	if recipe {
		for _, q := range top.Queues {
			if err := r.AddConsumerHandler(router.HandlerConfig{Queue: q.Name, Concurrency: 1, Retry: retry}, handle); err != nil {
				return isolation{}, err
			}
		}
	} else if err := r.AddConsumerHandler(router.HandlerConfig{Queue: queue, Lanes: orderedLanes, Retry: retry}, handle); err != nil {
		return isolation{}, err
	}
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	time.Sleep(2 * time.Second) // the lanes are taken at the balancer's first turn
	arrive()

	pub := r.Publisher()
	const batch = 10
	tick := time.NewTicker(time.Second * batch / time.Duration(*orderedRate))
	defer tick.Stop()
	start := time.Now()
	published := 0
	for time.Since(start) < *orderedFor {
		<-tick.C
		var msgs []*message.Message
		for range batch {
			key := fmt.Sprintf("k%04d", published%orderedKeys)
			body := binary.BigEndian.AppendUint64(nil, uint64(time.Now().UnixNano()))
			msg := message.NewMessage(watermill.NewUUID(), body)
			warren.OrderBy(msg, key)
			msgs = append(msgs, msg)
			published++
		}
		if !recipe {
			if err := pub.Publish(queue, msgs...); err != nil {
				return isolation{}, err
			}
			continue
		}
		for _, m := range msgs { // the recipe's publisher picks the queue by the hash itself
			if err := pub.Publish(topology.LaneQueue(queue, topology.Lane(warren.OrderKey(m), orderedLanes)), m); err != nil {
				return isolation{}, err
			}
		}
	}
	elapsed := time.Since(start)
	mu.Lock()
	counting = false
	rate := float64(laneCount) / elapsed.Seconds()
	mu.Unlock()
	// The other keys' messages still on their way count in the latencies: wait for them (the
	// recipe's held lane never gets to its own).
	others := published
	switch {
	case recipe:
		others = 0
	case held:
		others -= (published + orderedKeys - 1) / orderedKeys
	}
	for deadline := time.Now().Add(isoWait); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		n := len(latencies)
		mu.Unlock()
		if n >= others {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(latencies)
	iso := isolation{laneRate: rate, handled: len(latencies)}
	// A message not handled by then counts as isoWait late, at the end of the order.
	if i := max(len(latencies), others) * 99 / 100; i < len(latencies) {
		iso.p99 = latencies[i]
	} else {
		iso.p99 = isoWait
	}
	return iso, nil
}

// benchOrderedRate: how fast a handler with HandlerConfig.Lanes drains *orderedMessages
// messages of orderedKeys keys in its queue's lanes, against the plain router on as many in
// a plain queue (consumeWarren), in interleaved rounds. The runs are long enough that the
// lanes' start (leases, subscriptions: printed) is not most of them: the consume section's
// 20,000 messages are drained in well under a second.
func benchOrderedRate() {
	fmt.Printf("== ordered rate: %d persistent 256 B messages per run, of %d keys in turn, in the %d lanes of a %s queue ordered by key, against a plain one; median of %d runs\n",
		*orderedMessages, orderedKeys, orderedLanes, queueType(), *rounds)
	delay := config(topology.Delay{Prefix: name("delay")}).Delay
	defer cleanupDelay(delay)
	defer func(n int) { *consume = n }(*consume)
	*consume = *orderedMessages // the messages consumeWarren and consumeWarrenOrdered fill and drain
	lanesStarted = nil
	cmp := compare("ordered", *consume, []contender{
		{"warren router", func(q string) (time.Duration, error) { return consumeWarren(q, delay, warrenOptions{}) }},
		{"warren ordered", func(q string) (time.Duration, error) { return consumeWarrenOrdered(q, delay) }},
	})
	fmt.Printf("   (both: the default chain and concurrency 64, tracing into an SDK provider with a discarding exporter; ordered: one handler with HandlerConfig.Lanes, its lanes all delivering %.0f ms after Run, the median)\n",
		median(lanesStarted))
	result("ratio ordered_vs_unordered", "%.2f", cmp.ratio(1, 0))
}

// lanesStarted is, for every run of consumeWarrenOrdered, how long after Run every lane had
// delivered a message, in milliseconds.
var lanesStarted []float64

// consumeWarrenOrdered is consumeWarren on a queue ordered by key: the *consume messages, of
// orderedKeys keys in turn, wait in the lanes of their keys (as warren's publisher routes
// them), and a handler with HandlerConfig.Lanes handles them one key at a time.
func consumeWarrenOrdered(queue string, delay topology.Delay) (time.Duration, error) {
	tcfg := config(delay)
	b, err := topology.NewBuilder(tcfg, nil)
	if err != nil {
		return 0, err
	}
	top := topology.Topology{Queues: []topology.Queue{{Name: queue, Lanes: orderedLanes}}}
	lanes := []string{router.MembersQueue(queue), topology.HeldState(queue)}
	for i := range orderedLanes {
		lanes = append(lanes, topology.LaneQueue(queue, i), topology.HeldQueue(queue, i))
	}
	defer cleanup(lanes, nil)
	conn, ch, err := confirmChannel(func(ch *amqp.Channel) error { return b.Declare(context.Background(), ch, top) })
	if err != nil {
		return 0, err
	}
	body := make([]byte, 256)
	var last *amqp.DeferredConfirmation
	for i := range *consume {
		id, key := watermill.NewUUID(), fmt.Sprintf("key-%d", i%orderedKeys)
		last, err = ch.PublishWithDeferredConfirmWithContext(context.Background(), "", topology.LaneQueue(queue, topology.Lane(key, orderedLanes)),
			false, false, amqp.Publishing{Body: body, DeliveryMode: amqp.Persistent, MessageId: id,
				Headers: amqp.Table{contract.PublishIDHeader: id, warren.MetadataOrderKey: key}})
		if err != nil {
			_ = conn.Close()
			return 0, err
		}
	}
	ok := last.Wait()
	_ = conn.Close()
	if !ok {
		return 0, fmt.Errorf("fill: not confirmed")
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	r, err := router.New(router.Config{Connection: warren.Connection{URL: *url}, Topology: tcfg, Declare: top, TracerProvider: tp}, nil)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	var n, started atomic.Int64
	var seen [orderedLanes]atomic.Bool
	var allLanes time.Time
	done := make(chan struct{})
	if err := r.AddConsumerHandler(router.HandlerConfig{Queue: queue, Lanes: orderedLanes}, func(m *message.Message) error {
		if !seen[topology.Lane(warren.OrderKey(m), orderedLanes)].Swap(true) && started.Add(1) == orderedLanes {
			allLanes = time.Now()
		}
		if n.Add(1) == int64(*consume) {
			close(done)
		}
		return nil
	}); err != nil {
		return 0, err
	}
	w := startSpan()
	go func() { _ = r.Run(context.Background()) }()
	<-done
	elapsed := w.stop()
	lanesStarted = append(lanesStarted, float64(allLanes.Sub(w.start).Microseconds())/1000)
	return elapsed, nil
}
