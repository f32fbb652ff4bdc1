package topology_test

import (
	"context"
	"fmt"
	"os"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/topology"
)

// Declare a topic exchange and a work queue bound to it, then verify them.
func ExampleBuilder() {
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	top := topology.Topology{
		Exchanges: []topology.Exchange{{Name: "warren.example.topology.events", Kind: topology.Topic}},
		Queues:    []topology.Queue{{Name: "warren.example.topology.billing"}},
		Bindings: []topology.Binding{
			{Exchange: "warren.example.topology.events", Queue: "warren.example.topology.billing", Key: "order.*"},
		},
	}
	b, err := topology.NewBuilder(topology.Config{
		// Delay levels of the example's own (the default is warren.delay), 4 of them (delays up
		// to 65 s) rather than the default's 193 queues, to declare and delete quickly.
		Delay: topology.Delay{Prefix: "warren.example.topology.delay", Levels: 4},
	}, nil)
	if err != nil {
		panic(err)
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	deleteExample(ch, b.Delay(), top) // what an interrupted run left
	defer deleteExample(ch, b.Delay(), top)

	report, _ := b.Verify(context.Background(), warren.Connection{URL: url}, top)
	fmt.Println("before, missing:", len(report.Missing)) // 67 of the delay levels, 4 of ours
	if err := b.Declare(context.Background(), ch, top); err != nil {
		panic(err)
	}
	report, _ = b.Verify(context.Background(), warren.Connection{URL: url}, top)
	fmt.Print("after: ", report)
	// Output:
	// before, missing: 71
	// after: ok
}

// deleteExample deletes what the example declared: the delay levels, the exchanges, and the
// work queues with their poison queues and kill exchanges. An application keeps them.
func deleteExample(ch *amqp.Channel, delay topology.Delay, t topology.Topology) {
	queues, exchanges := delay.Names()
	for _, q := range t.Queues {
		queues = append(queues, q.Name, topology.PoisonQueue(q.Name))
		exchanges = append(exchanges, topology.KillExchange(q.Name))
	}
	for _, x := range t.Exchanges {
		exchanges = append(exchanges, x.Name)
	}
	for _, q := range queues {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
	for _, x := range exchanges {
		_ = ch.ExchangeDelete(x, false, false)
	}
}
