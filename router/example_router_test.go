package router_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/handlers"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

type greeting struct {
	Name string `json:"name"`
}

// A typed handler on a work queue: its first attempt fails, the retry 100ms later succeeds.
func ExampleRouter() {
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	// Delay levels of the example's own (the default is warren.delay): 2 of them (delays up to
	// 255 ms, enough for its retry) rather than the default's 193 queues, to declare and delete
	// quickly.
	delay := topology.Delay{Prefix: "warren.example.router.delay", Levels: 2}
	const queue = "warren.example.router.greetings"
	defer deleteExample(url, delay, queue)

	r, err := router.New(router.Config{
		Connection: warren.Connection{URL: url},
		Topology:   topology.Config{Delay: delay},
		Retry:      middleware.BackoffConfig{Delays: []time.Duration{100 * time.Millisecond}},
	}, nil)
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	err = r.AddConsumerHandler(router.HandlerConfig{Queue: queue},
		handlers.JSON(func(ctx context.Context, g greeting) error {
			attempt := middleware.AttemptFromContext(ctx)
			if attempt == 1 {
				fmt.Println("attempt 1: failing")
				return errors.New("not yet")
			}
			fmt.Printf("attempt %d: hello, %s\n", attempt, g.Name)
			close(done)
			return nil
		}))
	if err != nil {
		panic(err)
	}
	go func() { _ = r.Run(context.Background()) }() // until Close, SIGINT or SIGTERM
	<-r.Running()

	msg, err := handlers.NewJSON(context.Background(), greeting{Name: "warren"})
	if err != nil {
		panic(err)
	}
	if err := r.Publisher().Publish(queue, msg); err != nil {
		panic(err)
	}
	<-done
	if err := r.Close(); err != nil {
		panic(err)
	}
	// Output:
	// attempt 1: failing
	// attempt 2: hello, warren
}

// deleteExample deletes what the example declared: the work queue, its poison queue and kill
// exchange, and the delay levels. An application keeps them.
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
