package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/ledger"
	"github.com/warrenmq/warren/topology"
)

// benchDelay publishes *delayed messages with delays spread uniformly from 10ms to
// *maxWait, in random order from many goroutines, and measures how late each arrives
// against the time Publish was called plus its delay: on levels of this run's queue type
// (quorum by default), then, unless -delay-classic=false, once more on classic levels.
func benchDelay() {
	s := runDelay(queueType(), false)
	s.report("delay")
	result("delay_queues", "%d", s.queues)
	if *dclassic && queueType() != topology.Classic {
		runDelay(topology.Classic, false).report("delay_classic")
	}
}

// report adds the lines prefix_p50_ms, _p99_ms, _max_ms and _early.
func (s delayStats) report(prefix string) {
	result(prefix+"_p50_ms", "%.1f", s.p50)
	result(prefix+"_p99_ms", "%.1f", s.p99)
	result(prefix+"_max_ms", "%.1f", s.max)
	result(prefix+"_early", "%d", s.early)
}

type delayStats struct {
	p50, p99, max float64
	early, queues int
	lists         int     // with listing: how many times the ledger was listed
	listMs        float64 // and the mean time a list took
}

// benchLedger is the delay bench with every message scheduled under an id (warren.Schedule),
// and the ledger listed over and over while they wait: listing must not make them late.
func benchLedger() {
	s := runDelay(queueType(), true)
	s.report("delay_listing")
	result("ledger_lists", "%d", s.lists)
	result("ledger_list_ms", "%.1f", s.listMs)
}

// runDelay runs the delay bench on levels (and a destination queue) of type typ; with
// listing, the messages are scheduled under ids and a ledger lists them until they arrived.
func runDelay(typ topology.QueueType, listing bool) delayStats {
	cfg := config(topology.Delay{Prefix: name("delay"), Radix: *radix})
	cfg.QueueType, cfg.Delay.QueueType = typ, typ
	layout := cfg.Delay
	q := name("delayed")
	defer cleanupDelay(layout)
	defer cleanup(testenv.WorkQueueNames(q))

	p, err := dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: *url}, Topology: cfg}, nil)
	must(err)
	defer p.Close()
	must(p.Publish(q)) // declare the destination

	fmt.Printf("== delay: %d messages, delays uniform in [10ms, %s], published by %d goroutines; %s levels radix %d, %d levels, unit %s, %d queues\n",
		*delayed, *maxWait, *dpubs, layout.QueueType, layout.Radix, layout.Levels, layout.Unit, layout.QueueCount())

	delays := make([]time.Duration, *delayed)
	for i := range delays {
		delays[i] = 10*time.Millisecond + time.Duration(rand.Int64N(int64(*maxWait-10*time.Millisecond)))
	}
	due := make([]time.Time, len(delays))
	hops, hopsOf := 0, make([]int, len(delays))
	for i, d := range delays {
		plan, err := layout.Plan(d)
		must(err)
		hops += plan.Hops
		hopsOf[i] = plan.Hops
	}
	byHops := map[int][]float64{}

	lateness := make([]float64, 0, len(delays))
	early := 0
	var mu sync.Mutex
	consumed := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), *maxWait+2*time.Minute)
		defer cancel()
		close(ready)
		consumed <- consumeAll(ctx, q, len(delays), func(d amqp.Delivery, at time.Time) {
			i, _ := strconv.Atoi(d.MessageId)
			mu.Lock()
			late := at.Sub(due[i])
			mu.Unlock()
			if late < 0 {
				early++
			}
			ms := float64(late) / float64(time.Millisecond)
			lateness = append(lateness, ms)
			byHops[hopsOf[i]] = append(byHops[hopsOf[i]], ms)
		})
	}()
	<-ready

	start := time.Now()
	_, err = parallel(*dpubs, len(delays), nextPublish(p, q, delays, due, &mu, listing))
	must(err)
	fmt.Printf("   published in %s; waiting for the longest delay\n", time.Since(start).Round(time.Millisecond))
	var lists int
	var listTime time.Duration
	if listing {
		l, err := ledger.New(ledger.Config{Connection: warren.Connection{URL: *url}, Delay: layout}, nil)
		must(err)
		defer l.Close()
		defer cleanup([]string{layout.LedgerQueue()}, nil)
	list:
		for {
			select {
			case err := <-consumed:
				must(err)
				break list
			default:
			}
			t := time.Now()
			entries, err := l.List(context.Background(), ledger.Filter{})
			must(err)
			listTime += time.Since(t)
			if lists++; lists == 1 {
				fmt.Printf("   first list: %d entries in %s\n", len(entries), time.Since(t).Round(time.Millisecond))
			}
			select { // as an operator or a dashboard would: now and then
			case err := <-consumed:
				must(err)
				break list
			case <-time.After(*listEvery):
			}
		}
		fmt.Printf("   listed %d times while they waited (every %s), %.1f ms each on average\n", lists, *listEvery,
			float64(listTime)/float64(lists)/1e6)
	} else {
		must(<-consumed)
	}

	sort.Float64s(lateness)
	s := delayStats{
		p50: percentile(lateness, 0.50), p99: percentile(lateness, 0.99), max: lateness[len(lateness)-1],
		early: early, queues: layout.QueueCount(), lists: lists,
	}
	if lists > 0 {
		s.listMs = float64(listTime) / float64(lists) / 1e6
	}
	fmt.Printf("   lateness: p50 %.1f ms, p99 %.1f ms, max %.1f ms; early: %d; mean hops %.2f\n",
		s.p50, s.p99, s.max, early, float64(hops)/float64(len(delays)))
	for h := 0; h <= layout.Levels; h++ {
		if l := byHops[h]; len(l) > 0 {
			sort.Float64s(l)
			fmt.Printf("     %d hops: %5d messages, p50 %.1f ms, p99 %.1f ms\n", h, len(l), percentile(l, 0.5), percentile(l, 0.99))
		}
	}
	return s
}

// nextPublish returns a function that publishes the next delayed message each time it is
// called, recording its due time just before Publish.
func nextPublish(p *dlx.Publisher, q string, delays []time.Duration, due []time.Time, mu *sync.Mutex, scheduled bool) func() error {
	var next int
	var nmu sync.Mutex
	return func() error {
		nmu.Lock()
		i := next
		next++
		nmu.Unlock()
		msg := message.NewMessage(strconv.Itoa(i), nil)
		warren.Delay(msg, delays[i])
		if scheduled {
			warren.Schedule(msg, "")
		}
		mu.Lock()
		due[i] = time.Now().Add(delays[i])
		mu.Unlock()
		return p.Publish(q, msg)
	}
}
