package dlx_test

import (
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// Publish one message at once and two delayed ones, with warren's API and with Watermill's
// delay metadata; they arrive in the order they are due.
func Example() {
	pub, err := dlx.NewPublisher(dlx.Config{
		Connection: warren.Connection{URL: testenv.URL()},
		// The default delay levels are named warren.delay.*; this example uses its own.
		Topology: topology.Config{Delay: topology.Delay{Prefix: "warren.example.dlx.delay"}},
	}, nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	const queue = "warren.example.reminders"
	defer removeExample(pub.Delay(), queue)

	later := message.NewMessage(watermill.NewUUID(), []byte("400ms, warren's API"))
	dlx.Delay(later, 400*time.Millisecond)
	sooner := message.NewMessage(watermill.NewUUID(), []byte("200ms, Watermill's"))
	delay.Message(sooner, delay.For(200*time.Millisecond))
	now := message.NewMessage(watermill.NewUUID(), []byte("0s, no delay"))

	start := time.Now()
	if err := pub.Publish(queue, later, sooner, now); err != nil { // declares the queue first
		panic(err)
	}
	for _, m := range receive(queue, 3) {
		elapsed := time.Since(start)
		asked, _ := time.ParseDuration(string(m.Payload[:strings.Index(string(m.Payload), ",")]))
		fmt.Printf("%-20s arrived early: %v\n", m.Payload, elapsed < asked)
	}
	// Output:
	// 0s, no delay         arrived early: false
	// 200ms, Watermill's   arrived early: false
	// 400ms, warren's API  arrived early: false
}

// receive reads n messages from queue.
func receive(queue string, n int) []*message.Message {
	conn, err := amqp.Dial(testenv.URL())
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		panic(err)
	}
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		panic(err)
	}
	var msgs []*message.Message
	for d := range deliveries {
		m, _ := warren.Marshaler{}.Unmarshal(d)
		if msgs = append(msgs, m); len(msgs) == n {
			break
		}
	}
	return msgs
}

// removeExample deletes what the example declared.
func removeExample(d topology.Delay, queue string) {
	qs, xs := d.Names()
	wq, wx := testenv.WorkQueueNames(queue)
	_ = testenv.DeleteAt(testenv.URL(), append(qs, wq...), append(xs, wx...))
}
