package dlx_test

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/components/delay"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/topology"
)

// Publish one message at once and two delayed ones, with warren's API and with Watermill's
// delay metadata; none arrives before it is due. (They usually arrive in the order they are due,
// but a broker under load may hand the undelayed one out after the 200 ms one: a delay is a
// lower bound, so the output is unordered.)
func Example() {
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	pub, err := dlx.NewPublisher(dlx.Config{
		Connection: warren.Connection{URL: url},
		// The default delay levels are named warren.delay.*; this example uses 3 levels of its
		// own (delays up to 4 s; the default's 193 queues reach 10 years).
		Topology: topology.Config{Delay: topology.Delay{Prefix: "warren.example.dlx.delay", Levels: 3}},
	}, nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	const queue = "warren.example.reminders"
	defer deleteExample(url, pub.Delay(), queue)

	later := message.NewMessage(watermill.NewUUID(), []byte("400ms, warren's API"))
	warren.Delay(later, 400*time.Millisecond)
	sooner := message.NewMessage(watermill.NewUUID(), []byte("200ms, Watermill's"))
	delay.Message(sooner, delay.For(200*time.Millisecond))
	now := message.NewMessage(watermill.NewUUID(), []byte("0s, no delay"))

	start := time.Now()
	if err := pub.Publish(queue, later, sooner, now); err != nil { // declares the queue first
		panic(err)
	}
	for _, m := range receive(url, queue, 3) {
		elapsed := time.Since(start)
		asked, _ := time.ParseDuration(string(m.Payload[:strings.Index(string(m.Payload), ",")]))
		fmt.Printf("%-20s arrived early: %v\n", m.Payload, elapsed < asked)
	}
	// Unordered output:
	// 0s, no delay         arrived early: false
	// 200ms, Watermill's   arrived early: false
	// 400ms, warren's API  arrived early: false
}

// receive reads n messages from queue with amqp091-go (a warren router would do it in an
// application).
func receive(url, queue string, n int) []*message.Message {
	conn, err := amqp.Dial(url)
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

// deleteExample deletes what the example declared: the queue, its poison queue and kill
// exchange (the publisher declared it as a work queue), and the delay levels. An application
// keeps them.
func deleteExample(url string, delay topology.Delay, queue string) {
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
	for _, q := range append(queues, queue, topology.PoisonQueue(queue)) {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
	for _, x := range append(exchanges, topology.KillExchange(queue)) {
		_ = ch.ExchangeDelete(x, false, false)
	}
}
