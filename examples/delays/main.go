// Command delays is warren's demo (`make demo`): it declares a small topology, publishes
// ordinary and delayed messages (one of them after a longer one, one to a topic exchange
// that routes it by pattern on arrival), consumes them and prints, for each, the delay it
// asked for and the delay it got.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/topology"
)

const (
	events = "warren.demo.events" // a topic exchange
	orders = "warren.demo.orders" // bound to events with "order.*"
	tasks  = "warren.demo.tasks"  // a work queue, addressed directly
)

func main() {
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), "Usage: go run ./examples/delays\n\n"+
			"Declare a small topology, publish ordinary and delayed messages, and print the delay each asked\n"+
			"for and the delay it got.\n"+
			"The broker is $WARREN_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/).\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if err := run(url); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// clock prints a time relative to the first publish.
var clock func(time.Time) string

func run(url string) error {
	logger := watermill.NopLogger{}
	tcfg := topology.Config{} // default delay levels: radix 16, 1 ms unit
	top := topology.Topology{
		Exchanges: []topology.Exchange{{Name: events, Kind: topology.Topic}},
		Queues:    []topology.Queue{{Name: orders}, {Name: tasks}},
		Bindings:  []topology.Binding{{Exchange: events, Queue: orders, Key: "order.*"}},
	}
	// Topics that look like routing keys ("order.created") go to the events exchange,
	// anything else to the work queue of that name.
	route := func(topic string) dlx.Route {
		if strings.Contains(topic, ".") && !strings.HasPrefix(topic, "warren.") {
			return dlx.Route{Exchange: events, RoutingKey: topic}
		}
		return dlx.ToQueue(topic)
	}
	pub, err := dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: url}, Topology: tcfg, Declare: top, Route: route}, logger)
	if err != nil {
		return err
	}
	defer pub.Close()
	d := pub.Delay()
	fmt.Printf("delay levels %s: radix %d, %d levels, %d queues, unit %s, up to %s\n\n",
		d.Name(), d.Radix, d.Levels, d.QueueCount(), d.Unit, d.Max())

	builder, err := topology.NewBuilder(tcfg, logger)
	if err != nil {
		return err
	}
	subCfg := wamqp.NewDurableQueueConfig(url)
	subCfg.Marshaler = warren.Marshaler{}
	subCfg.TopologyBuilder = builder
	sub, err := wamqp.NewSubscriber(subCfg, logger)
	if err != nil {
		return err
	}
	defer sub.Close()

	plan := []struct {
		topic string
		delay time.Duration
		pause time.Duration // before publishing
	}{
		{tasks, 0, 0},
		{tasks, 3 * time.Second, 0},
		{tasks, 1500 * time.Millisecond, 0},
		{tasks, 500 * time.Millisecond, 200 * time.Millisecond}, // published after the 3s one
		{"order.created", 2 * time.Second, 0},                   // routed by pattern on arrival
		{"order.eu.created", 0, 0},                              // matches no pattern: returned
		{tasks, 1234 * time.Millisecond, 0},
	}
	want := 0
	for _, p := range plan {
		if p.topic != "order.eu.created" {
			want++
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		arrived int
		done    = make(chan struct{})
	)
	for _, q := range []string{tasks, orders} {
		msgs, err := sub.Subscribe(ctx, q)
		if err != nil {
			return err
		}
		wg.Go(func() {
			for msg := range msgs {
				now := time.Now()
				sent, _ := time.Parse(time.RFC3339Nano, msg.Metadata.Get("sent_at"))
				fmt.Printf("%s  arrived   %-20s requested %-7s actual %-9s in %s\n", clock(now), msg.Metadata.Get("name"),
					msg.Metadata.Get("requested"), now.Sub(sent).Round(100*time.Microsecond), q)
				msg.Ack()
				mu.Lock()
				arrived++
				if arrived == want {
					close(done)
				}
				mu.Unlock()
			}
		})
	}

	start := time.Now()
	clock = func(t time.Time) string { return fmt.Sprintf("%+7.3fs", t.Sub(start).Seconds()) }
	fmt.Println("   time   event     message              (actual = from Publish to the consumer)")
	for i, p := range plan {
		time.Sleep(p.pause)
		msg := message.NewMessage(watermill.NewUUID(), []byte(fmt.Sprintf("message %d", i)))
		msg.Metadata.Set("name", fmt.Sprintf("#%d %s", i, strings.TrimPrefix(p.topic, "warren.demo.")))
		msg.Metadata.Set("requested", p.delay.String())
		if p.delay > 0 {
			warren.Delay(msg, p.delay)
		}
		now := time.Now()
		msg.Metadata.Set("sent_at", now.Format(time.RFC3339Nano))
		fmt.Printf("%s  publish   %-20s delay %s\n", clock(now), msg.Metadata.Get("name"), p.delay)
		err := pub.Publish(p.topic, msg)
		switch {
		case err != nil && p.topic == "order.eu.created":
			fmt.Printf("%s  refused   %-20s as expected: no queue binds it: %v\n", clock(time.Now()), msg.Metadata.Get("name"), err)
		case err != nil:
			return err
		}
	}
	select {
	case <-done:
	case <-ctx.Done():
		return fmt.Errorf("only %d of %d messages arrived", arrived, want)
	}
	cancel()
	wg.Wait()
	return cleanup(url)
}

// cleanup removes the demo's queues and exchange; the delay levels stay, as they would in
// production.
func cleanup(url string) error {
	conn, err := amqp.Dial(firstNode(url))
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	for _, q := range []string{orders, tasks} {
		for _, name := range []string{q, topology.PoisonQueue(q)} {
			if _, err := ch.QueueDelete(name, false, false, false); err != nil {
				return err
			}
		}
		if err := ch.ExchangeDelete(topology.KillExchange(q), false, false); err != nil {
			return err
		}
	}
	return ch.ExchangeDelete(events, false, false)
}

// firstNode is the first URL of a list of a cluster's nodes (warren's components take the
// whole list; amqp091's Dial one URL).
func firstNode(url string) string {
	first, _, _ := strings.Cut(url, ",")
	return first
}
