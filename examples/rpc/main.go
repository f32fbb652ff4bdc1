// Command rpc shows request/reply: a router handler with Reply answers quote requests; a
// client calls it with direct reply-to and with a reply queue of its own, sends one request
// without waiting, and gets an error reply for a request the server gives up (at once for an
// unknown symbol, after its retries for a failing feed) and a timeout for one it answers too
// late. It prints each call, its answer and how long it took.
//
//	go run ./examples/rpc
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/rpc"
	"github.com/warrenmq/warren/topology"
)

const queue = "warren.example.rpc"

type quoteRequest struct {
	Symbol string `json:"symbol"`
}

type quote struct {
	Symbol string `json:"symbol"`
	Cents  int    `json:"cents"`
}

func main() {
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), "Usage: go run ./examples/rpc\n\n"+
			"Answer quote requests with a router handler, and call it with direct reply-to and with a reply\n"+
			"queue of its own.\n"+
			"The broker is $WARREN_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/).\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if err := run(url); err != nil {
		fmt.Fprintln(os.Stderr, "rpc:", err)
		os.Exit(1)
	}
}

// logged is told when the server got the request sent without waiting.
var logged = make(chan struct{}, 1)

// quoteOf is the server's handler.
func quoteOf(ctx context.Context, req quoteRequest) (quote, error) {
	switch req.Symbol {
	case "WRN":
		return quote{req.Symbol, 4200}, nil
	case "RBT":
		return quote{req.Symbol, 1337}, nil
	case "FEED": // fails every time: retried, then poisoned
		return quote{}, errors.New("price feed unavailable")
	case "SLOW": // answers after its caller gave up: the reply is dropped
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
		return quote{req.Symbol, 1}, nil
	case "LOG": // sent without waiting
		logged <- struct{}{}
		return quote{req.Symbol, 0}, nil // no reply-to: dropped
	}
	return quote{}, warren.Permanent(fmt.Errorf("unknown symbol %q", req.Symbol))
}

func run(url string) error {
	defer cleanup(url)
	r, err := router.New(router.Config{
		Connection: warren.Connection{URL: url},
		Retry:      middleware.BackoffConfig{Delays: []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}},
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	if err := r.AddHandler(router.HandlerConfig{Queue: queue, Reply: true}, rpc.Handler(quoteOf)); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	defer func() { _ = stop(r, done) }()
	select {
	case <-r.Running():
	case err := <-done:
		return err
	}

	for _, mode := range []struct {
		name       string
		replyQueue string
	}{{"direct reply-to", ""}, {"reply queue warren.example.rpc.replies", "warren.example.rpc.replies"}} {
		c, err := rpc.NewClient(rpc.ClientConfig{
			Connection: warren.Connection{URL: url},
			ReplyQueue: mode.replyQueue,
			Timeout:    500 * time.Millisecond,
		}, watermill.NopLogger{})
		if err != nil {
			return err
		}
		fmt.Printf("client with %s:\n", mode.name)
		symbols := []string{"WRN", "RBT"}
		if mode.replyQueue == "" {
			symbols = append(symbols, "XYZ", "FEED", "SLOW")
		}
		for _, symbol := range symbols {
			start := time.Now()
			q, err := rpc.Call[quoteRequest, quote](context.Background(), c, queue, quoteRequest{symbol})
			took := time.Since(start).Round(100 * time.Microsecond)
			var remote *rpc.RemoteError
			switch {
			case errors.As(err, &remote):
				fmt.Printf("  %-4s -> error reply after %d attempt(s), %s: %s  (%s)\n", symbol, remote.Attempts, remote.Reason, remote.Err, took)
			case errors.Is(err, context.DeadlineExceeded):
				fmt.Printf("  %-4s -> %v  (%s)\n", symbol, err, took)
			case err != nil:
				return err
			default:
				fmt.Printf("  %-4s -> %d cents  (%s)\n", q.Symbol, q.Cents, took)
			}
		}
		if mode.replyQueue == "" {
			if err := rpc.Send(context.Background(), c, queue, quoteRequest{"LOG"}); err != nil {
				return err
			}
			fmt.Println("  LOG  -> sent: the broker has it; no reply-to, so the server's answer is dropped")
			<-logged
			fmt.Println("         (the server got it)")
		}
		if err := c.Close(); err != nil { // deletes the reply queue
			return err
		}
	}
	return nil
}

// cleanup deletes what the demo declared: the work queue, its poison queue and kill
// exchange, and the delay levels (warren's defaults, shared with other demos: kept). An
// application keeps them all.
func cleanup(url string) {
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

// stop closes r and waits for its Run, which sends its error to done, to return.
func stop(r *router.Router, done <-chan error) error {
	err := r.Close()
	return errors.Join(err, <-done)
}
