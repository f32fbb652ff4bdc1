package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/rpc"
	"github.com/warrenmq/warren/topology"
)

var (
	rpcCalls   = flag.Int("rpc-calls", 10000, "request/reply round trips per run")
	rpcCallers = flag.Int("rpc-callers", 64, "goroutines calling at once, each waiting for its reply")
)

// benchRPC: request/reply round trips per second, *rpcCallers callers at once on one client,
// against one server consuming a queue of warren's type.
func benchRPC() {
	fmt.Printf("== rpc: %d request/reply round trips per run (64 B requests), %d callers at once, server on a %s queue, median of %d runs\n",
		*rpcCalls, *rpcCallers, queueType(), *rounds)
	delay := config(topology.Delay{Prefix: name("delay"), Levels: 1}).Delay
	defer cleanupDelay(delay)
	cmp := compare("rpc", *rpcCalls, []contender{
		{"raw direct", func(q string) (time.Duration, error) { return rpcRaw(q, false) }},
		{"warren direct", func(q string) (time.Duration, error) { return rpcWarren(q, delay, "") }},
		{"warren queue", func(q string) (time.Duration, error) { return rpcWarren(q, delay, topology.Quorum) }},
		{"warren classic q", func(q string) (time.Duration, error) { return rpcWarren(q, delay, topology.Classic) }},
		{"raw confirmed", func(q string) (time.Duration, error) { return rpcRaw(q, true) }},
	})
	fmt.Printf("   (raw direct: amqp091-go on both sides, direct reply-to, requests and replies unconfirmed, server prefetch 256 and acks; " +
		"raw confirmed: the same with requests and replies confirmed as warren's are, each request acked once its reply is confirmed; " +
		"warren: rpc.Client (requests confirmed) and a router handler with Reply (default chain, concurrency 64, replies confirmed), " +
		"direct reply-to, a quorum reply queue (the default) or a classic one; msg/s are round trips per second)\n")
	result("ratio rpc_direct_vs_raw", "%.2f", cmp.ratio(1, 0))
	result("ratio rpc_direct_vs_raw_confirmed", "%.2f", cmp.ratio(1, 4))
	result("ratio rpc_allocs_vs_raw_confirmed", "%.2f", cmp.allocRatio(1, 4))
	result("ratio rpc_queue_vs_raw", "%.2f", cmp.ratio(2, 0))
	result("ratio rpc_queue_vs_direct", "%.2f", cmp.ratio(2, 1))
	result("ratio rpc_classic_queue_vs_queue", "%.2f", cmp.ratio(3, 2))
}

// rpcRaw: a raw amqp091-go server and client, as a minimal RPC over direct reply-to is
// written, one channel per side. Unconfirmed, nothing waits for the broker; confirmed, a
// caller waits for its request's confirmation before its reply, and the server acks a
// request once its reply is confirmed (in order, from a goroutine of its own, so that the
// server goes on replying meanwhile), as warren does.
func rpcRaw(q string, confirmed bool) (time.Duration, error) {
	sconn, sch, err := dialChannel()
	if err != nil {
		return 0, err
	}
	defer sconn.Close()
	if _, err := sch.QueueDeclare(q, true, false, false, false, queueArgs(q)); err != nil {
		return 0, err
	}
	if err := sch.Qos(256, 0, false); err != nil {
		return 0, err
	}
	if confirmed {
		if err := sch.Confirm(false); err != nil {
			return 0, err
		}
	}
	requests, err := sch.Consume(q, "", false, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	type answered struct {
		d  amqp.Delivery
		dc *amqp.DeferredConfirmation
	}
	acks := make(chan answered, 256)
	go func() { // ends when sconn closes
		defer close(acks)
		for d := range requests {
			dc, err := sch.PublishWithDeferredConfirm("", d.ReplyTo, false, false, amqp.Publishing{CorrelationId: d.CorrelationId, Body: d.Body})
			if err != nil {
				return
			}
			acks <- answered{d, dc}
		}
	}()
	go func() {
		for a := range acks {
			if a.dc != nil && !a.dc.Wait() { // nil: the channel is not in confirm mode
				continue
			}
			_ = a.d.Ack(false)
		}
	}()

	conn, ch, err := dialChannel()
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	if confirmed {
		if err := ch.Confirm(false); err != nil {
			return 0, err
		}
	}
	replies, err := ch.Consume(warren.DirectReplyTo, "", true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	var mu sync.Mutex
	waiting := map[string]chan amqp.Delivery{}
	go func() {
		for d := range replies {
			mu.Lock()
			w := waiting[d.CorrelationId]
			delete(waiting, d.CorrelationId)
			mu.Unlock()
			if w != nil {
				w <- d
			}
		}
	}()
	body := make([]byte, 64)
	var seq sync.Mutex
	next := 0
	return parallel(*rpcCallers, *rpcCalls, func() error {
		seq.Lock()
		next++
		id := strconv.Itoa(next)
		seq.Unlock()
		w := make(chan amqp.Delivery, 1)
		mu.Lock()
		waiting[id] = w
		mu.Unlock()
		dc, err := ch.PublishWithDeferredConfirm("", q, true, false, amqp.Publishing{CorrelationId: id, ReplyTo: warren.DirectReplyTo, Body: body})
		if err != nil {
			return err
		}
		if dc != nil && !dc.Wait() {
			return fmt.Errorf("raw: request %s nacked", id)
		}
		select {
		case <-w:
			return nil
		case <-time.After(30 * time.Second):
			return fmt.Errorf("raw: no reply to %s", id)
		}
	})
}

// rpcWarren: rpc.Client against a router handler with Reply, with direct reply-to (no
// replyQueue type) or a reply queue of that type.
func rpcWarren(q string, delay topology.Delay, replyQueue topology.QueueType) (time.Duration, error) {
	r, err := router.New(router.Config{Connection: warren.Connection{URL: *url}, Topology: config(delay)}, watermill.NopLogger{})
	if err != nil {
		return 0, err
	}
	defer r.Close()
	err = r.AddHandler(router.HandlerConfig{Queue: q, Reply: true}, func(msg *message.Message) ([]*message.Message, error) {
		return []*message.Message{message.NewMessage(watermill.NewUUID(), msg.Payload)}, nil
	})
	if err != nil {
		return 0, err
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	select {
	case <-r.Running():
	case err := <-done:
		return 0, fmt.Errorf("router: %w", err)
	}
	defer func() { _ = stop(r, done) }()

	cfg := rpc.ClientConfig{Connection: warren.Connection{URL: *url}}
	if replyQueue != "" {
		cfg.ReplyQueue, cfg.ReplyQueueType = name("replies"), replyQueue
	}
	c, err := rpc.NewClient(cfg, nil)
	if err != nil {
		return 0, err
	}
	defer c.Close() // deletes the reply queue
	body := make([]byte, 64)
	ctx := context.Background()
	return parallel(*rpcCallers, *rpcCalls, func() error {
		_, err := c.Call(ctx, q, message.NewMessage(watermill.NewUUID(), body))
		return err
	})
}

// stop closes r and waits for its Run, which sends its error to done, to return.
func stop(r *router.Router, done <-chan error) error {
	err := r.Close()
	return errors.Join(err, <-done)
}
