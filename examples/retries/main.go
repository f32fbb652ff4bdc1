// Command retries shows warren's per-attempt backoff: a handler that always fails is tried
// again after 1s, 5s and 30s (or -delays), then its message goes to the poison queue, whose
// headers say why. It prints when each attempt ran.
//
//	go run ./examples/retries [-delays 1s,5s,30s]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

const queue = "warren.example.retries"

func main() {
	delaysFlag := flag.String("delays", "1s,5s,30s", "waits before attempts 2, 3, ...")
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), "Usage: go run ./examples/retries [-delays 1s,5s,30s]\n\n"+
			"Run a handler that always fails: it is tried again after each delay, then its message is poisoned.\n"+
			"The broker is $WARREN_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/).\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	var delays []time.Duration
	for _, s := range strings.Split(*delaysFlag, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			fmt.Fprintln(os.Stderr, "retries: -delays:", err)
			os.Exit(2)
		}
		delays = append(delays, d)
	}
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if err := run(url, delays); err != nil {
		fmt.Fprintln(os.Stderr, "retries:", err)
		os.Exit(1)
	}
}

func run(url string, delays []time.Duration) error {
	r, err := router.New(router.Config{
		Connection: warren.Connection{URL: url},
		Retry:      middleware.BackoffConfig{Delays: delays}, // then poison: len(delays)+1 attempts
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer r.Close()
	defer cleanup(url)

	var (
		mu          sync.Mutex
		start, last time.Time
	)
	err = r.AddConsumerHandler(router.HandlerConfig{Name: "charge", Queue: queue}, func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		n := middleware.Attempt(msg)
		wait := ""
		if n > 1 {
			wait = fmt.Sprintf("  (%s after attempt %d; schedule: %s)", now.Sub(last).Round(time.Millisecond), n-1, delays[min(n-1, len(delays))-1])
		}
		fmt.Printf("%7.3fs  attempt %d fails%s\n", now.Sub(start).Seconds(), n, wait)
		last = now
		return errors.New("payment provider unavailable")
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	<-r.Running()

	fmt.Printf("schedule %v, then the poison queue %s\n\n", delays, topology.PoisonQueue(queue))
	mu.Lock()
	start = time.Now()
	last = start
	mu.Unlock()
	if err := r.Publisher().Publish(queue, message.NewMessage(watermill.NewUUID(), []byte(`{"order":"o-42"}`))); err != nil {
		return err
	}
	d, err := waitPoison(url, start)
	if err != nil {
		return err
	}
	fmt.Printf("%7.3fs  in %s, with:\n", time.Since(start).Seconds(), topology.PoisonQueue(queue))
	var keys []string
	for k := range d.Headers {
		if warren.IsPoisonBookkeeping(k) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Printf("           %-28s %v\n", k, d.Headers[k])
	}
	return nil
}

func waitPoison(url string, start time.Time) (amqp.Delivery, error) {
	conn, err := amqp.Dial(firstNode(url))
	if err != nil {
		return amqp.Delivery{}, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return amqp.Delivery{}, err
	}
	for time.Since(start) < 10*time.Minute {
		d, ok, err := ch.Get(topology.PoisonQueue(queue), true)
		if err != nil {
			return d, err
		}
		if ok {
			return d, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return amqp.Delivery{}, errors.New("nothing reached the poison queue")
}

// cleanup removes the example's queue; the delay levels stay, as in production.
func cleanup(url string) {
	conn, err := amqp.Dial(firstNode(url))
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	_, _ = ch.QueueDelete(queue, false, false, false)
	_, _ = ch.QueueDelete(topology.PoisonQueue(queue), false, false, false)
	_ = ch.ExchangeDelete(topology.KillExchange(queue), false, false)
}

// firstNode is the first URL of a list of a cluster's nodes (warren's components take the
// whole list; amqp091's Dial one URL).
func firstNode(url string) string {
	first, _, _ := strings.Cut(url, ",")
	return first
}
