package consumer_test

import (
	"context"
	"fmt"
	"os"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/consumer"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/topology"
)

// A Subscriber without a router: Subscribe declares the work queue (with its poison queue and
// kill exchange) and hands out its messages; each is settled once it is acked.
func ExampleSubscriber() {
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	conn := warren.Connection{URL: url}
	noLevels := topology.Config{Delay: topology.Delay{Disabled: true}} // nothing here is delayed
	const queue = "warren.example.consumer.greetings"
	defer deleteExample(url, queue)

	s, err := consumer.NewSubscriber(consumer.Config{Connection: conn, Topology: noLevels, HandlerName: "greetings"}, nil)
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs, err := s.Subscribe(ctx, queue) // the topic is the queue's name
	if err != nil {
		panic(err)
	}

	p, err := dlx.NewPublisher(dlx.Config{Connection: conn, Topology: noLevels}, nil)
	if err != nil {
		panic(err)
	}
	if err := p.Publish(queue, message.NewMessage(watermill.NewUUID(), []byte("hello, warren"))); err != nil {
		panic(err)
	}

	msg := <-msgs
	fmt.Println(string(msg.Payload))
	msg.Ack()
	if err := p.Close(); err != nil {
		panic(err)
	}
	if err := s.Close(); err != nil {
		panic(err)
	}
	// Output: hello, warren
}

// deleteExample deletes what the example declared: the work queue, its poison queue and kill
// exchange. An application keeps them.
func deleteExample(url, queue string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	for _, q := range []string{queue, topology.PoisonQueue(queue)} {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
	_ = ch.ExchangeDelete(topology.KillExchange(queue), false, false)
}
