// Command ordered shows a queue ordered by key: the events of 20 orders (created, paid,
// packed, shipped) are published one order after another into 4 lanes, handled 8 at a time
// a lane, and every fifth order's payment fails once and is retried. Each order's events are
// handled in the order they happened; other orders go on while one waits for its retry. One
// order's payment fails for good: it is poisoned and the order is held (its packing and
// shipping wait) until the program, as an operator would, releases it.
//
//	go run ./examples/ordered
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

const (
	queue  = "warren.example.ordered"
	lanes  = 4
	orders = 20
)

var events = []string{"created", "paid", "packed", "shipped"}

func main() {
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), "Usage: go run ./examples/ordered\n\n"+
			"Handle the events of 20 orders in order per order, through retries, over 4 lanes.\n"+
			"The broker is $WARREN_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/).\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if err := run(url); err != nil {
		fmt.Fprintln(os.Stderr, "ordered:", err)
		os.Exit(1)
	}
}

func run(url string) error {
	r, err := router.New(router.Config{
		Connection: warren.Connection{URL: url},
		Declare:    topology.Topology{Queues: []topology.Queue{{Name: queue, Lanes: lanes}}},
		Retry:      middleware.BackoffConfig{Delays: []time.Duration{200 * time.Millisecond}, MaxAttempts: 3},
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer cleanup(url)
	defer r.Close()

	var (
		mu      sync.Mutex
		handled = map[string][]string{} // order -> its events, as handled
		retried = map[string]bool{}
		total   int
		done    = make(chan struct{})
	)
	const blocked = "o-13" // its payment fails for good: poisoned, and the order held
	err = r.AddConsumerHandler(router.HandlerConfig{Name: "fulfil", Queue: queue, Lanes: lanes, Concurrency: 8}, func(msg *message.Message) error {
		order, event, _ := strings.Cut(string(msg.Payload), " ")
		time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond) // work of uneven length
		mu.Lock()
		defer mu.Unlock()
		if event == "paid" && order == blocked {
			return warren.Permanent(errors.New("card blocked"))
		}
		if event == "paid" && (strings.HasSuffix(order, "0") || strings.HasSuffix(order, "5")) && middleware.Attempt(msg) == 1 {
			retried[order] = true
			return errors.New("card declined, try again")
		}
		handled[order] = append(handled[order], event)
		if total++; total == orders*len(events)-1 { // all but the blocked payment
			close(done)
		}
		return nil
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = r.Run(ctx) }()
	<-r.Running()

	var msgs []*message.Message
	for o := range orders {
		order := fmt.Sprintf("o-%02d", o)
		for _, event := range events {
			msg := message.NewMessage(watermill.NewUUID(), []byte(order+" "+event))
			warren.OrderBy(msg, order)
			msgs = append(msgs, msg)
		}
	}
	start := time.Now()
	if err := r.Publisher().Publish(queue, msgs...); err != nil {
		return err
	}
	if err := releaseWhenHeld(ctx, url, blocked, &mu, handled); err != nil {
		return err
	}
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		return fmt.Errorf("%d of %d events handled", total, orders*len(events)-1)
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Printf("%d events of %d orders over %d lanes in %s\n\n", total, orders, lanes, time.Since(start).Round(time.Millisecond))
	outOfOrder := 0
	for o := range orders {
		order := fmt.Sprintf("o-%02d", o)
		got, want := strings.Join(handled[order], " "), strings.Join(events, " ")
		note := ""
		switch {
		case order == blocked:
			want, note = "created packed shipped", "   (paid: poisoned, the order held, then released)"
		case retried[order]:
			note = "   (paid: failed once, retried)"
		}
		if got != want {
			outOfOrder++
		}
		fmt.Printf("  %s  lane %d  %-28s%s\n", order, topology.Lane(order, lanes), got, note)
	}
	fmt.Printf("\norders out of order: %d\n", outOfOrder)
	if outOfOrder > 0 {
		return errors.New("an order's events were handled out of order")
	}
	return nil
}

// releaseWhenHeld waits until order is held, shows that its later events wait, and releases
// it as an operator would (warren held release).
func releaseWhenHeld(ctx context.Context, url, order string, mu *sync.Mutex, handled map[string][]string) error {
	o, err := ops.New(ops.Config{Connection: warren.Connection{URL: url}}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer o.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		keys, err := o.Held(ctx, queue)
		if err != nil {
			return err
		}
		if len(keys) == 1 && keys[0].Messages == 2 { // packed and shipped, parked
			mu.Lock()
			fmt.Printf("%s held after %q: %s handled, %d events wait\n", order, keys[0].Error, strings.Join(handled[order], " "), keys[0].Messages)
			mu.Unlock()
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s was not held: %+v", order, keys)
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Printf("release %s\n", order)
	return o.ReleaseKey(ctx, queue, order)
}

// cleanup removes the example's queue, its lanes, poison queue and kill exchange; the delay
// levels stay, as in production.
func cleanup(url string) {
	first, _, _ := strings.Cut(url, ",")
	conn, err := amqp.Dial(first)
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	for i := range lanes {
		_, _ = ch.QueueDelete(topology.LaneQueue(queue, i), false, false, false)
		_, _ = ch.QueueDelete(topology.HeldQueue(queue, i), false, false, false)
	}
	_, _ = ch.QueueDelete(topology.HeldState(queue), false, false, false)
	_, _ = ch.QueueDelete(queue, false, false, false)
	_, _ = ch.QueueDelete(topology.PoisonQueue(queue), false, false, false)
	_ = ch.ExchangeDelete(topology.KillExchange(queue), false, false)
}
