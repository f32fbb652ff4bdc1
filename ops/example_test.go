package ops_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// A handler gives up on three orders for a reason that is then fixed: the operator finds the
// failure group and replays it, and the handler processes them.
func Example() {
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	const queue = "warren.example.ops.orders"
	// Delay levels of the example's own (the default is warren.delay): 2 of them (delays up to
	// 255 ms; it retries nothing) rather than the default's 193 queues, to declare and delete
	// quickly.
	delay := topology.Delay{Prefix: "warren.example.ops.delay", Levels: 2}
	defer deleteExample(url, delay, queue)

	var fixed atomic.Bool
	processed := make(chan string)
	r, err := router.New(router.Config{Connection: warren.Connection{URL: url}, Topology: topology.Config{Delay: delay}}, nil)
	if err != nil {
		panic(err)
	}
	defer r.Close()
	err = r.AddConsumerHandler(router.HandlerConfig{Name: "charge", Queue: queue}, func(m *message.Message) error {
		if !fixed.Load() {
			return warren.Permanent(fmt.Errorf("order %s: card service rejected the API key", m.Payload))
		}
		processed <- string(m.Payload)
		return nil
	})
	if err != nil {
		panic(err)
	}
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	for _, order := range []string{"41", "42", "43"} {
		if err := r.Publisher().Publish(queue, message.NewMessage(watermill.NewUUID(), []byte(order))); err != nil {
			panic(err)
		}
	}

	o, err := ops.New(ops.Config{Connection: warren.Connection{URL: url}, Delay: delay}, nil)
	if err != nil {
		panic(err)
	}
	defer o.Close()
	ctx := context.Background()
	var poisoned []ops.Message
	for len(poisoned) < 3 { // until the handler has given up on all three
		if poisoned, err = o.Poisoned(ctx, queue, ops.Browse{}); err != nil {
			panic(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, g := range ops.Group(poisoned) {
		fmt.Printf("%d × %s: %s\n", g.Count, g.Handler, g.Error)
	}

	fixed.Store(true) // a new API key
	res, err := o.ReplayPoisoned(ctx, queue, ops.ReplayOptions{Filter: ops.Filter{Group: poisoned[0].Group}})
	if err != nil {
		panic(err)
	}
	fmt.Println("replayed:", res.Replayed)
	var orders []string
	for range res.Replayed {
		orders = append(orders, <-processed)
	}
	slices.Sort(orders) // the router processes them concurrently
	fmt.Println("processed orders", orders)
	// Output:
	// 3 × charge: permanent: order <n>: card service rejected the API key
	// replayed: 3
	// processed orders [41 42 43]
}

// deleteExample deletes what the example declared: the work queue, its poison queue and kill
// exchange, and the delay levels. An application keeps them.
func deleteExample(url string, delay topology.Delay, queue string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	queues, exchanges := delay.Names()
	queues = append(queues, queue, topology.PoisonQueue(queue), kill.StateQueue(queue, nil))
	exchanges = append(exchanges, topology.KillExchange(queue))
	for _, q := range queues {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
	for _, e := range exchanges {
		_ = ch.ExchangeDelete(e, false, false)
	}
}
