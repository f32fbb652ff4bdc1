package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

var (
	orderedRate = flag.Int("ordered-rate", 500, "ordered section: messages published per second")
	orderedFor  = flag.Duration("ordered-for", 60*time.Second, "ordered section: how long the load runs, and one key fails")
)

// The held key of the ordered section, and the lanes of its queues.
const (
	heldKey     = "k0000"
	isoLanes    = 8
	isoKeys     = 2000
	isoRetryGap = time.Second
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
// holds everything behind it).
func benchOrdered() {
	fmt.Printf("== ordered: %d msg/s of %d keys for %s over %d lanes; one key (%s) failing the whole run, retried every %s\n",
		*orderedRate, isoKeys, *orderedFor, isoLanes, heldKey, isoRetryGap)
	base, err := orderedIsolation(false, false)
	must(err)
	held, err := orderedIsolation(true, false)
	must(err)
	recipe, err := orderedIsolation(true, true)
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
}

// orderedIsolation runs the load once: on a queue ordered by key (or, recipe, on isoLanes
// queues with a single active consumer, one handler each with Concurrency 1), heldKey failing
// every attempt when held.
func orderedIsolation(held, recipe bool) (isolation, error) {
	queue := name("ordered")
	delay := config(topology.Delay{Prefix: name("delay"), Levels: 1}).Delay
	defer cleanupDelay(delay)
	top := topology.Topology{Queues: []topology.Queue{{Name: queue, Lanes: isoLanes}}}
	names := []string{router.MembersQueue(queue), topology.HeldState(queue)}
	for i := range isoLanes {
		names = append(names, topology.LaneQueue(queue, i), topology.HeldQueue(queue, i))
	}
	defer cleanup(names, nil)
	if recipe {
		top.Queues = nil
		for i := range isoLanes {
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
	heldLane := topology.Lane(heldKey, isoLanes)
	handle := func(msg *message.Message) error {
		key := warren.OrderKey(msg)
		if held && key == heldKey {
			return errors.New("held: this key fails")
		}
		lat := time.Since(time.Unix(0, int64(binary.BigEndian.Uint64(msg.Payload))))
		mu.Lock()
		defer mu.Unlock()
		latencies = append(latencies, lat)
		if counting && topology.Lane(key, isoLanes) == heldLane {
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
	} else if err := r.AddConsumerHandler(router.HandlerConfig{Queue: queue, Lanes: isoLanes, Retry: retry}, handle); err != nil {
		return isolation{}, err
	}
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	time.Sleep(2 * time.Second) // the lanes are taken at the balancer's first turn

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
			key := fmt.Sprintf("k%04d", published%isoKeys)
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
			if err := pub.Publish(topology.LaneQueue(queue, topology.Lane(warren.OrderKey(m), isoLanes)), m); err != nil {
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
		others -= (published + isoKeys - 1) / isoKeys
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
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
	if len(latencies) > 0 {
		iso.p99 = latencies[len(latencies)*99/100]
	}
	return iso, nil
}
