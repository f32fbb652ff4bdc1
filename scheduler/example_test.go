package scheduler_test

import (
	"context"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/scheduler"
	"github.com/warrenmq/warren/topology"
)

// Run a job every second: its ticks arrive a second apart, each with the job's payload and
// its tick's time. Start the same program in more processes, and one of them publishes.
func Example() {
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	const queue = "warren.example.scheduler.pings"
	// The default delay levels are named warren.delay.*; this example uses 4 levels of its own.
	delay := topology.Delay{Prefix: "warren.example.scheduler.delay", Levels: 4}
	defer deleteExample(url, delay, queue, "example")
	ticks := consume(url, queue)

	s, err := scheduler.New(scheduler.Config{
		Connection: warren.Connection{URL: url},
		Topology:   topology.Config{Delay: delay},
		Name:       "example",
		Jobs:       []scheduler.Job{{Name: "ping", Schedule: "@every 1s", Topic: queue, Payload: []byte("ping")}},
	}, nil)
	if err != nil {
		panic(err)
	}
	defer s.Close()
	go func() { _ = s.Run(context.Background()) }()

	var prev time.Time
	for range 2 {
		d := <-ticks
		tick, _ := time.Parse(time.RFC3339Nano, d.Headers[scheduler.MetadataTick].(string))
		fmt.Println(string(d.Body), d.Headers[scheduler.MetadataJob], "early:", time.Now().Before(tick))
		if !prev.IsZero() {
			fmt.Println("apart:", tick.Sub(prev))
		}
		prev = tick
	}
	// Output:
	// ping example/ping early: false
	// ping example/ping early: false
	// apart: 1s
}

// consume declares queue as warren declares a work queue, and consumes it.
func consume(url, queue string) <-chan amqp.Delivery {
	conn, err := amqp.Dial(url)
	if err != nil {
		panic(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	b, err := topology.NewBuilder(topology.Config{Delay: topology.Delay{Disabled: true}}, nil)
	if err == nil {
		err = b.DeclareQueue(context.Background(), ch, topology.Queue{Name: queue})
	}
	if err != nil {
		panic(err)
	}
	d, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		panic(err)
	}
	return d
}

// deleteExample deletes what the example declared: the queue, the delay levels, the group's
// queues.
func deleteExample(url string, delay topology.Delay, queue, group string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	queues, exchanges := delay.Names()
	queues = append(queues, queue, topology.PoisonQueue(queue), scheduler.LockQueue(scheduler.DefaultPrefix, group),
		scheduler.StateQueue(scheduler.DefaultPrefix, group))
	exchanges = append(exchanges, topology.KillExchange(queue))
	for _, q := range queues {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
	for _, x := range exchanges {
		_ = ch.ExchangeDelete(x, false, false)
	}
}
