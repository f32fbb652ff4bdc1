package rpc_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/rpc"
	"github.com/warrenmq/warren/topology"
)

type quoteRequest struct {
	Symbol string `json:"symbol"`
}

type quote struct {
	Symbol string `json:"symbol"`
	Cents  int    `json:"cents"`
}

// A server (a router handler with Reply) and a client calling it: answers, and an error
// reply for a request the server gives up.
func Example() {
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	const queue = "warren.example.rpc.quotes"
	delay := topology.Delay{Prefix: "warren.example.rpc.delay", Levels: 2} // an application keeps the defaults
	defer deleteExample(url, delay, queue)

	r, err := router.New(router.Config{
		Connection: warren.Connection{URL: url},
		Topology:   topology.Config{Delay: delay},
	}, nil)
	if err != nil {
		panic(err)
	}
	prices := map[string]int{"WRN": 4200, "RBT": 1337}
	err = r.AddHandler(router.HandlerConfig{Queue: queue, Reply: true},
		rpc.Handler(func(ctx context.Context, req quoteRequest) (quote, error) {
			cents, ok := prices[req.Symbol]
			if !ok { // retrying cannot help: poisoned at once, and the caller told
				return quote{}, warren.Permanent(fmt.Errorf("unknown symbol %q", req.Symbol))
			}
			return quote{Symbol: req.Symbol, Cents: cents}, nil
		}))
	if err != nil {
		panic(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	defer func() { _ = stop(r, done) }()
	<-r.Running()

	c, err := rpc.NewClient(rpc.ClientConfig{Connection: warren.Connection{URL: url}}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	defer c.Close()
	ctx := context.Background()
	for _, symbol := range []string{"WRN", "RBT", "XYZ"} {
		q, err := rpc.Call[quoteRequest, quote](ctx, c, queue, quoteRequest{Symbol: symbol})
		var remote *rpc.RemoteError
		switch {
		case errors.As(err, &remote):
			fmt.Printf("%s: error reply (%s): %s\n", symbol, remote.Reason, remote.Err)
		case err != nil:
			panic(err)
		default:
			fmt.Printf("%s: %d cents\n", q.Symbol, q.Cents)
		}
	}
	// Output:
	// WRN: 4200 cents
	// RBT: 1337 cents
	// XYZ: error reply (permanent error): permanent: unknown symbol "XYZ"
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
	queues, exchanges := delay.WithDefaults().Names()
	for _, q := range append(queues, queue, topology.PoisonQueue(queue)) {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
	for _, x := range append(exchanges, topology.KillExchange(queue)) {
		_ = ch.ExchangeDelete(x, false, false)
	}
}
