// Command consumer is warren's consumer demo: a router runs one handler on a work queue
// (warren.example.demo, which examples/publish publishes to) and prints every message it
// handles: its id, body, attempt, where it came from, the metadata a service would look at,
// and, for a message sent with a delay, when it was due and how late it came. It stops after
// -for (30s by default; 0: until interrupted), after -count messages, or on Ctrl-C
// (SIGINT, SIGTERM), gracefully: what it holds is finished and acked, the rest stays queued.
//
//	go run ./examples/consumer [-for 30s] [-count N] [-queue warren.example.demo] [-delete]
//
// and, in another terminal:
//
//	go run ./examples/publish -delay 5s -count 3
//
// It prints, e.g. (a run on this machine, with `-count 3` and the publish above with
// `-delay 3s -count 2`):
//
//	consuming warren.example.demo for 30s (Ctrl-C stops), or until 3 messages; publish to it with: go run ./examples/publish -delay 5s
//	17:31:32.896  #2 8aff10c2-303f-4313-ae8f-09d2294de3ea  body "hello from warren"  attempt 1
//	              to queue warren.example.demo; seq=1
//	              waited in the delay levels p2.d11 (2.816s) → p1.d11 (176ms) → p0.d5 (5ms)
//	              published 17:31:29.886, due 17:31:32.886 (requested 3s): arrived 9.9ms late
//	…
//	handled 3 messages in 4.961s; warren.example.demo stays, with what was not consumed
//
// The lateness needs the demo_due header (an RFC 3339 time), which examples/publish sets:
// warren's own due time travels in a transport header that handlers never see. Any other
// publisher can set it too, e.g. `warren publish warren.example.demo --delay 5s --header
// demo_due=...`.
//
// The queue (a quorum work queue, with its poison queue and kill exchange) is declared when
// the router starts and stays when it ends, like a service's: messages published to it while
// no consumer runs wait there for the next one. With -delete the run deletes it at the end
// (with its poison queue and kill exchange) if it is empty and nobody else consumes it; a
// delayed message still on its way to it is then parked (`warren parked list`).
//
// The broker is $WARREN_AMQP_URL, by default amqp://guest:guest@127.0.0.1:5672/.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/propagation"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

const defaultQueue = "warren.example.demo"

// Headers that examples/publish sets (any publisher may): they are the demo's, not warren's.
const (
	headerSeq       = "demo_seq"          // the message's number in its run
	headerPublished = "demo_published_at" // when Publish was called, RFC 3339
	headerDue       = "demo_due"          // when it is due, RFC 3339
	headerRequested = "demo_requested"    // the delay asked for: "5s", or "at <time>"
)

func main() {
	queue := flag.String("queue", defaultQueue, "the work queue to consume (declared if missing)")
	forDur := flag.Duration("for", 30*time.Second, "stop after this long (0: until interrupted)")
	count := flag.Int("count", 0, "stop after handling this many messages (0: no limit)")
	del := flag.Bool("delete", false, "at the end, delete the queue (and its poison queue and kill exchange) if it is empty and unused")
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), "Usage: go run ./examples/consumer [-for 30s] [-count N] [-queue Q] [-delete]\n\n"+
			"Consume a work queue with a router and print every message it handles (publish to it with\n"+
			"examples/publish).\n"+
			"The broker is $WARREN_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/).\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if err := run(url, *queue, *forDur, *count, *del); err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

func run(url, queue string, forDur time.Duration, count int, del bool) error {
	r, err := router.New(router.Config{
		Connection: warren.Connection{URL: url},
		// One message at a time, so that the lines of one message stay together.
		Concurrency:   1,
		HandleSignals: true, // Ctrl-C stops Run gracefully
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer r.Close()

	ctx, cancel := context.WithCancel(context.Background()) // cancelled after -count messages
	defer cancel()
	if forDur > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeout(ctx, forDur)
		defer stop()
	}

	var (
		mu      sync.Mutex
		handled int
	)
	err = r.AddConsumerHandler(router.HandlerConfig{Name: "print", Queue: queue}, func(msg *message.Message) error {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if count > 0 && handled >= count {
			// Past -count while the router stops: back to the queue, for the next consumer.
			return &middleware.RequeueError{Err: errors.New("this consumer has handled its -count messages")}
		}
		handled++
		printMessage(now, handled, msg)
		if count > 0 && handled == count {
			cancel()
		}
		return nil
	})
	if err != nil {
		return err
	}

	go func() {
		select {
		case <-r.Running():
			until := "until interrupted (Ctrl-C)"
			if forDur > 0 {
				until = fmt.Sprintf("for %s (Ctrl-C stops)", forDur)
			}
			if count > 0 {
				until += fmt.Sprintf(", or until %d messages", count)
			}
			fmt.Printf("consuming %s %s; publish to it with: go run ./examples/publish -delay 5s\n", queue, until)
		case <-ctx.Done():
		}
	}()
	start := time.Now()
	if err := r.Run(ctx); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	fmt.Printf("handled %d messages in %s", handled, time.Since(start).Round(time.Millisecond))
	if !del {
		fmt.Printf("; %s stays, with what was not consumed\n", queue)
		return nil
	}
	if err := r.Close(); err != nil { // our consumer off the queue first
		return err
	}
	deleted, err := deleteIfUnused(url, queue)
	switch {
	case err != nil:
		return err
	case deleted:
		fmt.Printf("; deleted %s, its poison queue and kill exchange\n", queue)
	default:
		fmt.Printf("; %s stays: it holds messages or has other consumers\n", queue)
	}
	return nil
}

// deleteIfUnused deletes queue, its poison queue and kill exchange if neither queue has a
// message or a consumer (the broker cannot delete a quorum queue "if empty": it is checked
// just before).
func deleteIfUnused(url, queue string) (bool, error) {
	c, err := amqp.Dial(firstNode(url))
	if err != nil {
		return false, err
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		return false, err
	}
	for _, name := range []string{queue, topology.PoisonQueue(queue)} {
		q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
		if err != nil {
			return false, err
		}
		if q.Messages > 0 || q.Consumers > 0 {
			return false, nil
		}
	}
	for _, name := range []string{queue, topology.PoisonQueue(queue)} {
		if _, err := ch.QueueDelete(name, false, false, false); err != nil {
			return false, err
		}
	}
	return true, ch.ExchangeDelete(topology.KillExchange(queue), false, false)
}

// firstNode is the first URL of a list of a cluster's nodes (warren's components take the
// whole list; amqp091's Dial one URL).
func firstNode(url string) string {
	first, _, _ := strings.Cut(url, ",")
	return first
}

// printMessage prints what a handler knows about msg.
func printMessage(now time.Time, n int, msg *message.Message) {
	const indent = "              "
	fmt.Printf("%s  #%d %s  body %q  attempt %d\n", clock(now), n, msg.UUID, msg.Payload, middleware.Attempt(msg))

	// Where it came from: the subscriber puts the delivery in the message's context.
	var from []string
	if d, ok := warren.DeliveryFrom(msg.Context()); ok {
		if d.Exchange == "" {
			from = append(from, "to queue "+d.RoutingKey)
		} else {
			from = append(from, fmt.Sprintf("from exchange %s, routing key %q", d.Exchange, d.RoutingKey))
		}
		if d.Redelivered {
			from = append(from, "redelivered")
		}
	}
	// The metadata a service would look at: the publisher's headers and the AMQP properties,
	// not warren's bookkeeping or the trace context.
	var meta []string
	for k, v := range msg.Metadata {
		if bookkeeping(k) {
			continue
		}
		if k == headerSeq {
			k = "seq"
		}
		meta = append(meta, k+"="+v)
	}
	sort.Strings(meta)
	line := strings.Join(from, " ")
	if len(meta) > 0 {
		line += "; " + strings.Join(meta, " ")
	}
	if line != "" {
		fmt.Println(indent + line)
	}

	if hs := hops(msg); len(hs) > 0 {
		fmt.Printf("%swaited in the delay levels %s\n", indent, strings.Join(hs, " → "))
	}

	// How late: the demo's own headers (warren's due time is a transport header, dropped
	// before the handler runs).
	published, perr := time.Parse(time.RFC3339Nano, msg.Metadata.Get(headerPublished))
	due, derr := time.Parse(time.RFC3339Nano, msg.Metadata.Get(headerDue))
	switch {
	case derr == nil:
		var pub string
		if perr == nil {
			pub = "published " + clock(published) + ", "
		}
		late := now.Sub(due)
		verdict := fmt.Sprintf("arrived %s late", late.Round(100*time.Microsecond))
		if late < 0 {
			verdict = fmt.Sprintf("arrived %s EARLY", (-late).Round(100*time.Microsecond))
		}
		fmt.Printf("%s%sdue %s (requested %s): %s\n", indent, pub, clock(due), msg.Metadata.Get(headerRequested), verdict)
	case perr == nil:
		fmt.Printf("%spublished %s, without a delay: arrived %s after\n", indent, clock(published),
			now.Sub(published).Round(100*time.Microsecond))
	}
}

// bookkeeping tells the metadata keys that are not shown as the message's own: the demo's
// headers shown apart, a delivery's bookkeeping (warren's retry and poison records, the
// broker's x-death and others: hops prints what x-death says), the replay count and the trace
// context.
func bookkeeping(k string) bool {
	switch k {
	case headerPublished, headerDue, headerRequested, warren.ReplaysKey:
		return true
	}
	return warren.IsBookkeeping(k) || slices.Contains(propagation.TraceContext{}.Fields(), k)
}

// hops lists the delay level queues a message waited in, from its x-death header (the
// Marshaler turns that table into JSON), in the order it passed them: "p2.d11 (2.816s)".
// Each hop is one nonzero digit of the delay, written in the levels' radix.
func hops(msg *message.Message) []string {
	var deaths []struct {
		Queue  string `json:"queue"`
		Reason string `json:"reason"`
	}
	if json.Unmarshal([]byte(msg.Metadata.Get(warren.XDeathHeader)), &deaths) != nil {
		return nil
	}
	levels := topology.Config{}.WithDefaults().Delay // the router's: the default delay levels
	type hop struct{ p, digit int }
	var hs []hop
	for _, d := range deaths {
		var h hop
		rest, ok := strings.CutPrefix(d.Queue, levels.Name()+".")
		if !ok || d.Reason != "expired" {
			continue
		}
		if _, err := fmt.Sscanf(rest, "p%d.d%d", &h.p, &h.digit); err == nil && levels.LevelQueue(h.p, h.digit) == d.Queue {
			hs = append(hs, h)
		}
	}
	sort.Slice(hs, func(i, j int) bool { return hs[i].p > hs[j].p }) // the highest position first
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = fmt.Sprintf("p%d.d%d (%s)", h.p, h.digit, levels.TTL(h.p, h.digit))
	}
	return out
}

// clock is t as a UTC wall-clock time, to the millisecond.
func clock(t time.Time) string { return t.UTC().Format("15:04:05.000") }
