package outbox_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/outbox"
	"github.com/warrenmq/warren/topology"
)

// An order and its event commit together; a transaction that rolls back publishes nothing.
// The relay publishes what committed and deletes it from the outbox.
func Example() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	amqpURL, pgURL := os.Getenv("WARREN_AMQP_URL"), os.Getenv("WARREN_POSTGRES_URL")
	if amqpURL == "" {
		amqpURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if pgURL == "" {
		pgURL = "postgres://postgres:postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	const schema, queue = "warren_example_outbox", "warren.example.outbox.orders"
	box, err := outbox.New(outbox.Config{Schema: schema}, nil)
	if err != nil {
		panic(err)
	}
	// A fresh start for the example; an application keeps its schema.
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		panic(err)
	}
	if err := box.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	defer pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") //nolint:errcheck // the example's own schema
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".orders (id int PRIMARY KEY)"); err != nil {
		panic(err)
	}

	// Two transactions, each an order and its event: the first commits, the second rolls back.
	for id, commit := range map[int]bool{1: true, 2: false} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			panic(err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+schema+".orders VALUES ($1)", id); err != nil {
			panic(err)
		}
		event := message.NewMessage(watermill.NewUUID(), fmt.Appendf(nil, `{"order":%d}`, id))
		if err := box.Publish(ctx, tx, queue, event); err != nil {
			panic(err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			panic(err)
		}
	}

	pub, err := dlx.NewPublisher(dlx.Config{
		Connection: warren.Connection{URL: amqpURL},
		// Delay levels of the example's own (the default's 193 queues reach 10 years).
		Topology: topology.Config{Delay: topology.Delay{Prefix: "warren.example.outbox.delay", Levels: 2}},
	}, nil)
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	defer deleteExample(amqpURL, pub.Delay(), queue)
	// The queue, declared before anything reads it (the relay's first publish would declare it).
	if err := pub.Declare(ctx, topology.Topology{Queues: []topology.Queue{{Name: queue}}}); err != nil {
		panic(err)
	}
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: pub, Schema: schema}, nil)
	if err != nil {
		panic(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(rctx) }()

	msg := receive(amqpURL, queue)
	fmt.Printf("published: %s\n", msg.Payload)
	// The relay deletes the row once the broker has confirmed the message, which may be
	// just after the message was delivered.
	var waiting int
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+schema+".outbox").Scan(&waiting); err != nil {
			panic(err)
		}
		if waiting == 0 {
			break
		}
	}
	fmt.Println("rows left in the outbox:", waiting)
	stop()
	if err := <-done; err != nil {
		panic(err)
	}
	// Output:
	// published: {"order":1}
	// rows left in the outbox: 0
}

// receive reads one message from queue with amqp091-go (a warren router would do it in an
// application), for up to 30 s.
func receive(url, queue string) *message.Message {
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
	select {
	case d := <-deliveries:
		m, _ := warren.Marshaler{}.Unmarshal(d)
		return m
	case <-time.After(30 * time.Second):
		panic("no message in " + queue + " within 30s")
	}
}

// deleteExample deletes what the example declared on the broker: the queue, its poison queue
// and kill exchange, and the delay levels. An application keeps them.
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
