// Command outbox shows warren's outbox and inbox on PostgreSQL (`go run ./examples/outbox`):
// an order service commits each order and its event in one transaction, its relay publishes
// the events; a billing service charges each order in a transaction that records the event
// (the inbox). Both are killed (SIGKILL) in the middle and started again: every order is
// charged once, none lost, none twice.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/outbox"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

const (
	schema = "warren_example_outbox"
	queue  = "warren.example.outbox.orders"
	prefix = "warren.example.outbox.delay" // delay levels of the demo's own
)

// levels are the demo's delay levels: light (it delays nothing), deleted at the end.
var levels = topology.Delay{Prefix: prefix, Levels: 2, QueueType: topology.Classic}

func main() {
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), "Usage: go run ./examples/outbox [-orders 300]\n\n"+
			"Run an order service (orders and their events committed together, a relay publishing the events)\n"+
			"and a billing service (each order charged in a transaction that records the event: the inbox);\n"+
			"kill each with SIGKILL in the middle and start it again; check that every order is charged once.\n"+
			"The broker is $WARREN_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/), the database\n"+
			"$WARREN_POSTGRES_URL (default postgres://postgres:postgres@127.0.0.1:5432/postgres).\n")
		flag.PrintDefaults()
	}
	orders := flag.Int("orders", 300, "orders to place")
	flag.Parse()
	amqpURL, pgURL := os.Getenv("WARREN_AMQP_URL"), os.Getenv("WARREN_POSTGRES_URL")
	if amqpURL == "" {
		amqpURL = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if pgURL == "" {
		pgURL = "postgres://postgres:postgres@127.0.0.1:5432/postgres?sslmode=disable"
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var err error
	switch os.Getenv("WARREN_EXAMPLE_OUTBOX") {
	case "orders":
		err = orderService(ctx, amqpURL, pgURL, *orders)
	case "billing":
		err = billingService(ctx, amqpURL, pgURL)
	default:
		err = demo(ctx, amqpURL, pgURL, *orders)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "outbox:", err)
		os.Exit(1)
	}
}

// orderService places orders from the one after the last placed up to n, each with its
// event in one transaction, and runs a relay; it goes on relaying until stopped.
func orderService(ctx context.Context, amqpURL, pgURL string, n int) error {
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	pub, err := dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: amqpURL}, Topology: topology.Config{Delay: levels}}, nil)
	if err != nil {
		return err
	}
	defer pub.Close()
	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: pub, Schema: schema}, nil)
	if err != nil {
		return err
	}
	relayed := make(chan error, 1)
	go func() { relayed <- relay.Run(ctx) }()
	box, err := outbox.New(outbox.Config{Schema: schema}, nil)
	if err != nil {
		return err
	}
	var last int
	if err := pool.QueryRow(ctx, "SELECT coalesce(max(id), 0) FROM "+schema+".orders").Scan(&last); err != nil {
		return err
	}
	fmt.Println("ready")
	for id := last + 1; id <= n && ctx.Err() == nil; id++ {
		if err := placeOrder(ctx, pool, box, id); err != nil {
			return err
		}
		time.Sleep(5 * time.Millisecond) // a steady flow, for the kills to land in
	}
	return <-relayed
}

// placeOrder commits order id and its event together.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, box *outbox.Outbox, id int) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit: nothing to undo
	if _, err := tx.Exec(ctx, "INSERT INTO "+schema+".orders (id) VALUES ($1)", id); err != nil {
		return err
	}
	body, _ := json.Marshal(map[string]int{"order": id})
	if err := box.Publish(ctx, tx, queue, message.NewMessage("order-"+strconv.Itoa(id), body)); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// billingService charges each order it is told of, inside the inbox's transaction, until
// stopped.
func billingService(ctx context.Context, amqpURL, pgURL string) error {
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	in, err := outbox.NewInbox(outbox.InboxConfig{Pool: pool, Schema: schema}, nil)
	if err != nil {
		return err
	}
	defer in.Close()
	r, err := router.New(router.Config{Connection: warren.Connection{URL: amqpURL}, Topology: topology.Config{Delay: levels}},
		watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer r.Close()
	err = r.AddConsumerHandler(router.HandlerConfig{Queue: queue, Middleware: []message.HandlerMiddleware{in.Middleware}},
		func(msg *message.Message) error {
			var o struct{ Order int }
			if err := json.Unmarshal(msg.Payload, &o); err != nil {
				return warren.Permanent(err)
			}
			tx, _ := outbox.TxFrom(msg.Context())
			_, err := tx.Exec(msg.Context(), "INSERT INTO "+schema+".charges (order_id) VALUES ($1)", o.Order)
			return err
		})
	if err != nil {
		return err
	}
	go func() {
		<-r.Running()
		fmt.Println("ready")
	}()
	return r.Run(ctx)
}

// service is a running child process of the demo.
type service struct {
	name string
	cmd  *exec.Cmd
}

// start starts the demo's own binary as service name, and returns once it says it is ready.
func start(name string, orders int) (*service, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-orders", strconv.Itoa(orders))
	cmd.Env = append(os.Environ(), "WARREN_EXAMPLE_OUTBOX="+name)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if sc.Text() == "ready" {
				close(ready)
			}
		}
	}()
	select {
	case <-ready:
		return &service{name, cmd}, nil
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("the %s service did not start within a minute", name)
	}
}

func (s *service) kill() {
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
}

func (s *service) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	_ = s.cmd.Wait()
}

func demo(ctx context.Context, amqpURL, pgURL string, n int) error {
	begin := time.Now()
	say := func(format string, args ...any) {
		fmt.Printf("%+8.3fs  "+format+"\n", append([]any{time.Since(begin).Seconds()}, args...)...)
	}
	pool, err := pgxpool.New(ctx, pgURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	// A clean start, and a clean end: the demo's schema, queue and delay levels.
	if err := clean(ctx, pool, amqpURL); err != nil {
		return err
	}
	defer clean(context.WithoutCancel(ctx), pool, amqpURL) //nolint:errcheck // best effort at the end
	if err := outbox.Migrate(ctx, pool, schema); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE "+schema+".orders (id int PRIMARY KEY); "+
		"CREATE TABLE "+schema+".charges (order_id int NOT NULL, charged timestamptz NOT NULL DEFAULT now())"); err != nil {
		return err
	}
	counts := func() (placed, charged int, err error) {
		err = pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+schema+".orders), (SELECT count(*) FROM "+schema+".charges)").
			Scan(&placed, &charged)
		return placed, charged, err
	}
	waitUntil := func(what string, ok func(placed, charged int) bool) error {
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			placed, charged, err := counts()
			if err != nil {
				return err
			}
			if ok(placed, charged) {
				return nil
			}
		}
		return fmt.Errorf("%s: not within 2 minutes", what)
	}

	orders, err := start("orders", n)
	if err != nil {
		return err
	}
	defer func() { orders.stop() }()
	billing, err := start("billing", n)
	if err != nil {
		return err
	}
	defer func() { billing.stop() }()
	say("order service and billing service started: %d orders to place", n)

	if err := waitUntil("a third of the orders placed", func(p, _ int) bool { return p >= n/3 }); err != nil {
		return err
	}
	orders.kill()
	placed, charged, _ := counts()
	say("killed the order service (SIGKILL): %d orders placed, %d charged", placed, charged)
	if orders, err = start("orders", n); err != nil {
		return err
	}
	say("order service started again: it places the rest, its relay publishes what the killed one had not")

	if err := waitUntil("half of the orders charged", func(_, c int) bool { return c >= n/2 }); err != nil {
		return err
	}
	billing.kill()
	placed, charged, _ = counts()
	say("killed the billing service (SIGKILL): %d orders placed, %d charged", placed, charged)
	if billing, err = start("billing", n); err != nil {
		return err
	}
	say("billing service started again: the broker redelivers what the killed one had not acked")

	if err := waitUntil("every order charged", func(p, c int) bool { return p == n && c >= n }); err != nil {
		return err
	}
	// Copies still on their way (a relay killed between the broker's confirm and its delete
	// sends rows again) would be charged within this window if the inbox let them through.
	time.Sleep(2 * time.Second)
	var lost, twice int
	if err := pool.QueryRow(ctx, "SELECT "+
		"(SELECT count(*) FROM "+schema+".orders o WHERE NOT EXISTS (SELECT 1 FROM "+schema+".charges c WHERE c.order_id = o.id)), "+
		"(SELECT count(*) FROM (SELECT order_id FROM "+schema+".charges GROUP BY order_id HAVING count(*) > 1) t)").
		Scan(&lost, &twice); err != nil {
		return err
	}
	placed, charged, _ = counts()
	say("%d orders placed, %d charges: %d orders never charged, %d charged twice", placed, charged, lost, twice)
	if lost != 0 || twice != 0 || charged != n {
		return fmt.Errorf("%d lost, %d twice", lost, twice)
	}
	say("every order charged exactly once")
	return nil
}

// clean deletes the demo's schema, queue and delay levels.
func clean(ctx context.Context, pool *pgxpool.Pool, amqpURL string) error {
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		return err
	}
	conn, err := amqp.Dial(amqpURL)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	queues, exchanges := levels.WithDefaults().Names()
	for _, q := range append(queues, queue, topology.PoisonQueue(queue)) {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return err
		}
	}
	for _, x := range append(exchanges, topology.KillExchange(queue)) {
		if err := ch.ExchangeDelete(x, false, false); err != nil {
			return err
		}
	}
	return nil
}
