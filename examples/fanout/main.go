// Command fanout is warren's fan-out demo, traced: one topic exchange, two consumer groups
// bound to it (the queues warren.example.fanout.billing and warren.example.fanout.shipping:
// each group gets every order event; consumers within a group would compete), one event
// published, and the whole trace printed by OpenTelemetry's stdout exporter: the
// application's "place order" span, the producer span of the publish and the consumer span
// of each group, all with one trace id, because warren carries the W3C trace context in the
// message's headers. It ends with a summary of the printed spans, read back from the
// exporter's output.
//
//	go run ./examples/fanout [-compact]
//
// -compact prints one JSON line per span instead of indented JSON (some 90 lines per span).
// A run (JSON abridged):
//
//	publishing order.created to exchange warren.example.fanout.orders, in trace b1b10272e6b8222fccea2fdf530abfbc
//	shipping  got order.created  {"order":42}  trace b1b10272e6b8222fccea2fdf530abfbc
//	billing   got order.created  {"order":42}  trace b1b10272e6b8222fccea2fdf530abfbc
//
//	the spans, as the stdout exporter prints them:
//	{
//		"Name": "process warren.example.fanout.shipping",
//		"SpanContext": {
//			"TraceID": "b1b10272e6b8222fccea2fdf530abfbc",
//	…
//
//	summary of the 4 spans printed above, by start time:
//	  place order                               internal  trace b1b10272…  span 9c4e23b24e04b9f6  (root)
//	  send order.created                        producer  trace b1b10272…  span ccaff59960c5d51d  child of place order
//	  process warren.example.fanout.shipping    consumer  trace b1b10272…  span ac700ee08ac3c0b2  child of send order.created
//	  process warren.example.fanout.billing     consumer  trace b1b10272…  span ef87e93fe97ef0b6  child of send order.created
//	one trace: 4 spans share trace id b1b10272e6b8222fccea2fdf530abfbc
//
// The router takes the TracerProvider in router.Config.TracerProvider: its Publisher starts
// the producer spans, its middleware chain (middleware.Tracing) the consumer spans. In a
// service, use an OTLP exporter instead of stdouttrace.
//
// The demo deletes its exchange and queues at the end. The broker is $WARREN_AMQP_URL, by
// default amqp://guest:guest@127.0.0.1:5672/.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

const (
	exchange = "warren.example.fanout.orders" // a topic exchange
	billing  = "warren.example.fanout.billing"
	shipping = "warren.example.fanout.shipping"
)

func main() {
	compact := flag.Bool("compact", false, "print one JSON line per span instead of indented JSON")
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), "Usage: go run ./examples/fanout [-compact]\n\n"+
			"Publish one order event to a topic exchange that two consumer groups are bound to, and print\n"+
			"the trace it makes.\n"+
			"The broker is $WARREN_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/).\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if err := run(url, *compact); err != nil {
		fmt.Fprintln(os.Stderr, "fanout:", err)
		os.Exit(1)
	}
}

func run(url string, compact bool) error {
	// The stdout exporter writes to stdout and, for the summary, to printed.
	var printed bytes.Buffer
	opts := []stdouttrace.Option{stdouttrace.WithWriter(io.MultiWriter(os.Stdout, &printed))}
	if !compact {
		opts = append(opts, stdouttrace.WithPrettyPrint())
	}
	exporter, err := stdouttrace.New(opts...)
	if err != nil {
		return err
	}
	// Batched: the spans are printed together, when the demo flushes them after the story.
	provider := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exporter),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", "warren-fanout-demo"))),
	)
	defer func() { _ = provider.Shutdown(context.Background()) }()

	r, err := router.New(router.Config{
		Connection:     warren.Connection{URL: url},
		TracerProvider: provider,                 // producer and consumer spans
		Route:          dlx.ToExchange(exchange), // topic = routing key
		Declare:        topology.Topology{Exchanges: []topology.Exchange{{Name: exchange, Kind: topology.Topic}}},
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer cleanup(url) // after Close (deferred calls run last first)
	defer r.Close()

	var (
		mu  sync.Mutex
		got sync.WaitGroup
	)
	got.Add(2)
	group := func(name string) message.NoPublishHandlerFunc {
		var once sync.Once // a redelivered copy is printed, and not counted again
		return func(msg *message.Message) error {
			d, _ := warren.DeliveryFrom(msg.Context())
			mu.Lock()
			fmt.Printf("%-8s  got %s  %s  trace %s\n", name, d.RoutingKey, msg.Payload, middleware.TraceID(msg))
			mu.Unlock()
			once.Do(got.Done)
			return nil
		}
	}
	// Two consumer groups of the exchange: each queue gets every message its keys match.
	if err := r.AddConsumerHandler(router.HandlerConfig{Name: "billing", Queue: billing,
		Exchange: exchange, Keys: []string{"order.*"}}, group("billing")); err != nil {
		return err
	}
	if err := r.AddConsumerHandler(router.HandlerConfig{Name: "shipping", Queue: shipping,
		Exchange: exchange, Keys: []string{"order.created"}}, group("shipping")); err != nil {
		return err
	}
	runErr := make(chan error, 1)
	go func() { runErr <- r.Run(context.Background()) }()
	select {
	case <-r.Running():
	case err := <-runErr:
		return err
	}

	// The application's own span; the publish continues its trace.
	ctx, span := provider.Tracer("warren-fanout-demo").Start(context.Background(), "place order")
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"order":42}`))
	msg.SetContext(ctx)
	mu.Lock()
	fmt.Printf("publishing order.created to exchange %s, in trace %s\n", exchange, span.SpanContext().TraceID())
	mu.Unlock()
	err = r.Publisher().Publish("order.created", msg) // returns once the broker confirmed it
	span.End()
	if err != nil {
		return err
	}

	done := make(chan struct{})
	go func() { got.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		return errors.New("the consumer groups did not both get the message within 30s")
	}
	if err := r.Close(); err != nil {
		return err
	}

	fmt.Println("\nthe spans, as the stdout exporter prints them:")
	if err := provider.ForceFlush(context.Background()); err != nil {
		return err
	}
	return summary(&printed)
}

// printedSpan is what the summary reads of a span in the exporter's JSON.
type printedSpan struct {
	Name        string
	StartTime   time.Time
	SpanKind    trace.SpanKind
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct{ SpanID string }
}

// summary reads back the spans the exporter printed and shows how they hang together.
func summary(printed io.Reader) error {
	var spans []printedSpan
	dec := json.NewDecoder(printed)
	for {
		var s printedSpan
		if err := dec.Decode(&s); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("read the exporter's output: %w", err)
		}
		spans = append(spans, s)
	}
	sort.SliceStable(spans, func(i, j int) bool { return spans[i].StartTime.Before(spans[j].StartTime) })
	names := map[string]string{}
	traces := map[string]bool{}
	for _, s := range spans {
		names[s.SpanContext.SpanID] = s.Name
		traces[s.SpanContext.TraceID] = true
	}
	fmt.Printf("\nsummary of the %d spans printed above, by start time:\n", len(spans))
	for _, s := range spans {
		parent := "(root)"
		if p := s.Parent.SpanID; p != "" && p != "0000000000000000" {
			parent = "child of " + names[p]
		}
		fmt.Printf("  %-40s  %-8s  trace %s  span %s  %s\n", s.Name, s.SpanKind, s.SpanContext.TraceID, s.SpanContext.SpanID, parent)
	}
	if len(traces) != 1 {
		return fmt.Errorf("the spans are in %d traces, not one", len(traces))
	}
	for id := range traces {
		fmt.Printf("one trace: %d spans share trace id %s\n", len(spans), id)
	}
	return nil
}

// cleanup deletes the demo's queues (with their poison queues and kill exchanges) and its
// exchange; the delay levels stay, as in production.
func cleanup(url string) {
	conn, err := amqp.Dial(firstNode(url))
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	for _, q := range []string{billing, shipping} {
		_, _ = ch.QueueDelete(q, false, false, false)
		_, _ = ch.QueueDelete(topology.PoisonQueue(q), false, false, false)
		_ = ch.ExchangeDelete(topology.KillExchange(q), false, false)
	}
	_ = ch.ExchangeDelete(exchange, false, false)
}

// firstNode is the first URL of a list of a cluster's nodes (warren's components take the
// whole list; amqp091's Dial one URL).
func firstNode(url string) string {
	first, _, _ := strings.Cut(url, ",")
	return first
}
