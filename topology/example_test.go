package topology_test

import (
	"context"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// Declare a topic exchange and a work queue bound to it, then verify them.
func ExampleBuilder() {
	top := topology.Topology{
		Exchanges: []topology.Exchange{{Name: "warren.example.topology.events", Kind: topology.Topic}},
		Queues:    []topology.Queue{{Name: "warren.example.topology.billing"}},
		Bindings: []topology.Binding{
			{Exchange: "warren.example.topology.events", Queue: "warren.example.topology.billing", Key: "order.*"},
		},
	}
	b, err := topology.NewBuilder(topology.Config{
		Delay: topology.Delay{Prefix: "warren.example.topology.delay"}, // the default is warren.delay
	}, nil)
	if err != nil {
		panic(err)
	}
	conn, err := amqp.Dial(testenv.URL())
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	defer remove(b.Delay(), top)

	report, _ := b.Verify(context.Background(), conn, top)
	fmt.Println("before, missing:", len(report.Missing)) // 131 of the delay levels, 4 of ours
	if err := b.Declare(context.Background(), ch, top); err != nil {
		panic(err)
	}
	report, _ = b.Verify(context.Background(), conn, top)
	fmt.Print("after: ", report)
	// Output:
	// before, missing: 135
	// after: ok
}

func remove(d topology.Delay, t topology.Topology) {
	qs, xs := d.Names()
	for _, q := range t.Queues {
		wq, wx := testenv.WorkQueueNames(q.Name)
		qs, xs = append(qs, wq...), append(xs, wx...)
	}
	for _, x := range t.Exchanges {
		xs = append(xs, x.Name)
	}
	_ = testenv.DeleteAt(testenv.URL(), qs, xs)
}
