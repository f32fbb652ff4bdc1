package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/when"
	"github.com/warrenmq/warren/topology"
)

// publishFlags are the flags of warren publish.
type publishFlags struct {
	delay    time.Duration
	at       string
	headers  []string
	exchange string
	file     string
	schedule bool
	delays   *delayFlags
}

func newPublish(g *globals) *cobra.Command {
	var f publishFlags
	publish := &cobra.Command{
		Use:   "publish TOPIC",
		Short: "Publish one message, now or delayed, and wait for the broker's confirm",
		Long: "Publish one message through warren's DLX publisher, with publisher confirms: when it prints the\n" +
			"message id, the broker has the message. TOPIC is a work queue (dlx.ToQueue: the default exchange\n" +
			"routes to the queue of that name); with --exchange E it is the routing key on exchange E\n" +
			"(dlx.ToExchange(E)), \"\" for a fanout. The body is --file, else stdin; --header k=v adds message\n" +
			"metadata (headers). --delay or --at sends it through the delay levels, which the delay level flags\n" +
			"(or --config FILE) must name as the services do.\n\n" +
			"The destination is never declared: it must exist (so a typo creates no queue). A delayed message\n" +
			"reaches a work queue or exchange through its binding from the delivery exchange, which warren\n" +
			"declares with it; without one it is parked (see `warren delays verify`).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error { return g.publish(cmd, args[0], f) },
	}
	fs := publish.Flags()
	fs.DurationVar(&f.delay, "delay", 0, "deliver this long after publishing (rounded up to the unit of the delay levels)")
	fs.StringVar(&f.at, "at", "", "deliver at this time: RFC 3339 (2026-01-02T15:04:05Z), or +D, a Go duration from the publish (+3s)")
	fs.StringArrayVar(&f.headers, "header", nil, "a header, key=value; repeat for more")
	fs.StringVar(&f.exchange, "exchange", "", "publish to this exchange, with TOPIC as the routing key")
	fs.StringVar(&f.file, "file", "", "read the body from this file (default: stdin)")
	fs.BoolVar(&f.schedule, "schedule", false, "record it in the ledger under its message id, to list and cancel it (with --delay or --at)")
	f.delays = addDelayFlags(fs)
	publish.MarkFlagsMutuallyExclusive("delay", "at")
	return publish
}

func (g *globals) publish(cmd *cobra.Command, topic string, f publishFlags) error {
	msg, due, err := f.message()
	if err != nil {
		return err
	}
	delayed := f.delayed()
	cfg, plan, err := f.delayLevels(g.timeout)
	if err != nil {
		return err
	}
	route, dest, err := f.route(topic)
	if err != nil {
		return err
	}
	body, err := readBody(cmd, f.file)
	if err != nil {
		return err
	}
	msg.Payload = body

	if err := g.onBroker(cmd, "check "+dest, func(ctx context.Context, conn *amqp.Connection) error {
		return exists(ctx, conn, route, cfg.Delay, delayed)
	}); err != nil {
		return err
	}
	conn, err := g.connection()
	if err != nil {
		return err
	}
	p, err := dlx.NewPublisher(dlx.Config{
		Connection:     conn,
		Topology:       cfg,
		Route:          func(string) dlx.Route { return route },
		PublishTimeout: g.timeout,
	}, logger(cmd))
	if err != nil {
		return err
	}
	defer p.Close()
	if strings.HasPrefix(f.at, "+") || strings.HasPrefix(f.at, "-") {
		// +D counts from the publish, not from the command's start: checking, connecting and
		// declaring the delay levels can take seconds on a loaded broker.
		due, _ = when.Parse(f.at, time.Now()) // it parsed in message
		warren.DeliverAt(msg, due)
	}
	start := time.Now()
	if err := p.Publish(topic, msg); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "published message %s to %s; %s\n", msg.UUID, dest, timing(f, plan, due, start, cfg.Delay))
	if f.schedule {
		fmt.Fprintf(cmd.OutOrStdout(), "scheduled under id %s: `warren scheduled list` shows it, `warren scheduled cancel %s` cancels it\n", msg.UUID, msg.UUID)
	}
	return nil
}

// delayed reports whether f sends the message through the delay levels.
func (f publishFlags) delayed() bool { return f.delay > 0 || f.at != "" }

// message is the message f describes, without its body: its headers, its delay, and its
// schedule; and when it is due with --at (zero: at once, or with --delay).
func (f publishFlags) message() (*message.Message, time.Time, error) {
	msg := message.NewMessage(watermill.NewUUID(), nil)
	for _, h := range f.headers {
		k, v, ok := strings.Cut(h, "=")
		if !ok || k == "" {
			return nil, time.Time{}, fmt.Errorf("--header %q is not key=value", h)
		}
		msg.Metadata.Set(k, v)
	}
	var due time.Time // zero: at once
	switch {
	case f.delay < 0:
		return nil, due, fmt.Errorf("--delay %s is negative", human(f.delay))
	case f.delay > 0:
		warren.Delay(msg, f.delay)
	case f.at != "":
		t, err := when.Parse(f.at, time.Now())
		if err != nil {
			return nil, due, fmt.Errorf("--at: %w", err)
		}
		warren.DeliverAt(msg, t)
		due = t
	}
	if f.schedule {
		if !f.delayed() {
			return nil, due, errors.New("--schedule needs --delay or --at: only a delayed message can be listed and cancelled")
		}
		warren.Schedule(msg, "")
	}
	return msg, due, nil
}

// delayLevels is the topology the publisher is given: the delay levels the flags name when
// the message is delayed, with the plan of --delay; else none, and nothing to declare.
func (f publishFlags) delayLevels(timeout time.Duration) (topology.Config, topology.Plan, error) {
	cfg := topology.Config{Delay: topology.Delay{Disabled: true}} // nothing to declare
	var plan topology.Plan
	if !f.delayed() {
		return cfg, plan, nil
	}
	cfg, err := f.delays.config(timeout)
	if err != nil {
		return cfg, plan, err
	}
	if plan, err = cfg.Delay.Plan(f.delay); err != nil { // --at is planned by Publish
		return cfg, plan, fmt.Errorf("--delay: %w", err)
	}
	return cfg, plan, nil
}

// route is where the message to topic goes, and how the output names it: the queue topic,
// or with --exchange that exchange with topic as the routing key.
func (f publishFlags) route(topic string) (dlx.Route, string, error) {
	if f.exchange != "" {
		return dlx.Route{Exchange: f.exchange, RoutingKey: topic, Declared: true},
			fmt.Sprintf("exchange %q with routing key %q", f.exchange, topic), nil
	}
	if topic == "" {
		return dlx.Route{}, "", errors.New("TOPIC is empty: name a queue, or give --exchange")
	}
	return dlx.Route{RoutingKey: topic, Declared: true}, fmt.Sprintf("queue %q", topic), nil
}

// timing says when a message published at start with f is delivered: now, or when it is due
// and in how long from start (with --delay, the delay it waits: --delay rounded up to the unit
// of the delay levels d, as plan has it; with --at, from start to due).
func timing(f publishFlags, plan topology.Plan, due, start time.Time, d topology.Delay) string {
	var in string
	switch {
	case f.delay > 0 && plan.Delay != f.delay:
		due = start.Add(plan.Delay)
		in = fmt.Sprintf("in %s: --delay %s rounded up to the unit of the delay levels, %s", human(plan.Delay), human(f.delay), human(d.Unit))
	case f.delay > 0:
		due = start.Add(plan.Delay)
		in = "in " + human(plan.Delay)
	case f.at != "":
		in = "in " + human(max(due.Sub(start), 0))
	default:
		return "delivered now"
	}
	return fmt.Sprintf("due %s (%s; through delay levels %s)", due.UTC().Format(time.RFC3339Nano), in, d.Name())
}

// readBody reads the body from path, or stdin when path is "" or "-".
func readBody(cmd *cobra.Command, path string) ([]byte, error) {
	if path == "" || path == "-" {
		body, err := io.ReadAll(cmd.InOrStdin())
		if err != nil {
			return nil, fmt.Errorf("read the body from stdin: %w", err)
		}
		return body, nil
	}
	body, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--file: %w", err)
	}
	return body, nil
}

// exists reports, as an error, a destination of route that does not exist, and, when
// delayed, delay levels d that do not.
func exists(ctx context.Context, conn *amqp.Connection, route dlx.Route, d topology.Delay, delayed bool) error {
	check := func(what, name, hint string, passive func(ch *amqp.Channel) error) error {
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		defer func() { _ = ch.Close() }()
		err = amqpx.Do(ctx, ch, func() error { return passive(ch) })
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return amqpx.GiveUp(&exitError{exitNoQueue, fmt.Sprintf("%s %q does not exist (warren publish declares nothing)%s", what, name, hint), nil})
		}
		return err
	}
	var err error
	if route.Exchange != "" {
		err = check("exchange", route.Exchange, "", func(ch *amqp.Channel) error {
			return ch.ExchangeDeclarePassive(route.Exchange, "", true, false, false, false, nil)
		})
	} else {
		err = check("queue", route.RoutingKey, "", func(ch *amqp.Channel) error {
			_, err := ch.QueueDeclarePassive(route.RoutingKey, true, false, false, false, nil)
			return err
		})
	}
	if err != nil || !delayed {
		return err
	}
	return check("exchange", d.DeliveryExchange(), fmt.Sprintf(": the delay levels %s are not declared; "+
		"give the delay level flags the services use, or declare them (`warren delays apply`)", d.Name()),
		func(ch *amqp.Channel) error {
			return ch.ExchangeDeclarePassive(d.DeliveryExchange(), "", true, false, false, false, nil)
		})
}
