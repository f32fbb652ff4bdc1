// Command publish is warren's publishing demo, in three forms, one command each:
//
//	go run ./examples/publish                  # an ordinary publish
//	go run ./examples/publish -delay 5s        # a delayed publish
//	go run ./examples/publish -at 2026-11-25T18:30:00Z   # a scheduled publish (or -at +10s: 10s from now)
//
// It publishes -count messages (1 by default) with the body -body to the work queue
// warren.example.demo through warren's DLX publisher (publisher confirms: a line saying
// "published" means the broker has the message), and prints each message's id and when it is
// due. Then, unless another process consumes the queue already (examples/consumer, which
// then prints them) or -wait=false, it consumes the queue itself until its messages have
// arrived and prints, for each, the delay requested and the delay it got, and how late it
// came (never early). A run on this machine:
//
//	$ go run ./examples/publish -delay 5s -count 3
//	publishing 3 messages to warren.example.demo, delayed 5s (delay levels warren.delay.quorum.1ms.r16)
//	17:33:11.496  published #1 cfed0c09-2199-4086-87cd-075b8a5a1c92  body "hello from warren"  due 17:33:16.496 (in 5s)
//	…
//	waiting for them on warren.example.demo (nobody else consumes it)
//	17:33:16.515  arrived   #1 cfed0c09-2199-4086-87cd-075b8a5a1c92  requested 5s  actual 5.019s  19.4ms late
//	…
//	all 3 arrived; deleted warren.example.demo (this run created it)
//
// The queue is declared (a quorum work queue with its poison queue and kill exchange) before
// the first publish, so nothing is lost when no consumer runs yet. The run deletes it at the
// end if it created it and left it empty and unused; otherwise it stays, for its consumer.
// The delay levels (warren.delay.quorum.1ms.r16.*) stay, as they would in production.
//
// Each message carries the demo's own headers demo_seq, demo_published_at, demo_due and
// demo_requested, from which examples/consumer prints its lateness: warren's own due time
// travels in a transport header that handlers never see.
//
// The broker is $WARREN_AMQP_URL, by default amqp://guest:guest@127.0.0.1:5672/.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

const defaultQueue = "warren.example.demo"

// The demo's own headers (examples/consumer reads them).
const (
	headerSeq       = "demo_seq"
	headerPublished = "demo_published_at"
	headerDue       = "demo_due"
	headerRequested = "demo_requested"
)

type options struct {
	queue string
	body  string
	count int
	delay time.Duration
	at    time.Time      // zero: not scheduled
	atIn  *time.Duration // -at +D: at is set to D after the connection is up, when publishing starts
	wait  bool
}

func main() {
	var o options
	flag.StringVar(&o.queue, "queue", defaultQueue, "the work queue to publish to (declared if missing)")
	flag.StringVar(&o.body, "body", "hello from warren", "the body of every message")
	flag.IntVar(&o.count, "count", 1, "how many messages to publish")
	flag.DurationVar(&o.delay, "delay", 0, "deliver each message this long after it is published")
	at := flag.String("at", "", "deliver every message at this time: RFC 3339 (2026-11-25T18:30:00Z), or +D, a Go duration from now (+10s)")
	flag.BoolVar(&o.wait, "wait", true, "consume the queue until the messages have arrived, unless another process consumes it")
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), "Usage: go run ./examples/publish [-delay D | -at T] [-count N] [-body B] [-queue Q] [-wait=false]\n\n"+
			"Publish messages through warren's DLX publisher, now, delayed or scheduled, and wait for them\n"+
			"to arrive.\n"+
			"The broker is $WARREN_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/).\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if err := o.parseAt(*at, time.Now()); err != nil {
		fmt.Fprintln(os.Stderr, "publish:", err)
		os.Exit(2)
	}
	if o.count < 1 || o.delay < 0 {
		fmt.Fprintln(os.Stderr, "publish: -count must be at least 1 and -delay not negative")
		os.Exit(2)
	}
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if err := run(url, o); err != nil {
		fmt.Fprintln(os.Stderr, "publish:", err)
		os.Exit(1)
	}
}

// parseAt sets o.at from -at: an RFC 3339 time, or +D, a Go duration after now.
func (o *options) parseAt(s string, now time.Time) error {
	switch {
	case s == "":
		return nil
	case o.delay != 0:
		return errors.New("-delay and -at exclude each other")
	}
	if d, ok := strings.CutPrefix(s, "+"); ok {
		after, err := time.ParseDuration(d)
		if err != nil {
			return fmt.Errorf("-at %q is not +D, a Go duration from now (+10s): %w", s, err)
		}
		o.at, o.atIn = now.Add(after), &after
		return nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return fmt.Errorf("-at %q is neither an RFC 3339 time (2026-11-25T18:30:00Z) nor +D, a Go duration from now (+10s)", s)
	}
	o.at = t
	return nil
}

// arrival is a message that the demo's consumer received, and when.
type arrival struct {
	id string
	at time.Time
}

// sent is what the demo knows of a message it published.
type sent struct {
	seq       int
	id        string
	published time.Time
	due       time.Time
}

func run(url string, o options) error {
	conn := warren.Connection{URL: url}
	logger := watermill.NopLogger{}

	existed, consumers, err := inspect(url, o.queue)
	if err != nil {
		return err
	}

	pub, err := dlx.NewPublisher(dlx.Config{Connection: conn}, logger) // topics are work queues: dlx.ToQueue
	if err != nil {
		return err
	}
	defer pub.Close()

	// Consume the queue ourselves, started before publishing, unless someone else does.
	wait := o.wait && consumers == 0
	var (
		mu       sync.Mutex
		byID     = map[string]sent{}
		arrivals = make(chan arrival, o.count+1024) // room for ours and leftovers of other runs
	)
	var r *router.Router
	if wait {
		r, err = router.New(router.Config{Connection: conn, Concurrency: 1}, logger)
		if err != nil {
			return err
		}
		defer r.Close()
		err = r.AddConsumerHandler(router.HandlerConfig{Name: "wait", Queue: o.queue}, func(msg *message.Message) error {
			select {
			case arrivals <- arrival{id: msg.UUID, at: time.Now()}: // printed by run, after the publish lines
			default: // more than 1024 leftovers: not printed
			}
			return nil
		})
		if err != nil {
			return err
		}
		go func() { _ = r.Run(context.Background()) }()
		select {
		case <-r.Running():
		case <-time.After(time.Minute):
			return errors.New("the consumer did not start within a minute")
		}
	}

	if o.atIn != nil { // from now, not from when the flags were read
		o.at = time.Now().Add(*o.atIn)
	}
	what := "at once"
	switch {
	case o.delay > 0:
		what = "delayed " + o.delay.String()
	case !o.at.IsZero():
		what = "scheduled for " + o.at.UTC().Format(time.RFC3339Nano)
	}
	if o.delay > 0 || !o.at.IsZero() {
		what += " (delay levels " + pub.Delay().Name() + ")"
	}
	fmt.Printf("publishing %s to %s, %s\n", plural(o.count, "message"), o.queue, what)

	var last time.Time // the latest due time
	for i := 1; i <= o.count; i++ {
		msg := message.NewMessage(watermill.NewUUID(), []byte(o.body))
		now := time.Now()
		s := sent{seq: i, id: msg.UUID, published: now, due: now}
		switch {
		case o.delay > 0:
			warren.Delay(msg, o.delay)
			s.due = now.Add(o.delay)
		case !o.at.IsZero():
			warren.DeliverAt(msg, o.at)
			s.due = o.at
		}
		msg.Metadata.Set(headerSeq, strconv.Itoa(i))
		msg.Metadata.Set(headerPublished, now.UTC().Format(time.RFC3339Nano))
		if o.delay > 0 || !o.at.IsZero() {
			msg.Metadata.Set(headerDue, s.due.UTC().Format(time.RFC3339Nano))
			msg.Metadata.Set(headerRequested, requested(o))
		}
		mu.Lock()
		byID[msg.UUID] = s
		mu.Unlock()
		if err := pub.Publish(o.queue, msg); err != nil { // returns once the broker confirmed it
			return err
		}
		due := "not delayed"
		if s.due.After(now) {
			due = fmt.Sprintf("due %s (in %s)", clock(s.due), s.due.Sub(now).Round(time.Millisecond))
		}
		fmt.Printf("%s  published #%d %s  body %q  %s\n", clock(now), i, msg.UUID, o.body, due)
		last = s.due
	}

	switch {
	case !o.wait:
		fmt.Printf("not waiting (-wait=false): the messages wait in %s for a consumer (go run ./examples/consumer)\n", o.queue)
		return nil
	case !wait:
		fmt.Printf("not waiting: %s has %s already, which gets %s\n", o.queue, plural(consumers, "consumer"), pronoun(o.count))
		return nil
	}
	fmt.Printf("waiting for %s on %s (nobody else consumes it)\n", pronoun(o.count), o.queue)
	timeout := time.After(time.Until(last) + 30*time.Second)
	for arrived := 0; arrived < o.count; {
		select {
		case a := <-arrivals:
			mu.Lock()
			s, ours := byID[a.id]
			delete(byID, a.id)
			mu.Unlock()
			if !ours {
				fmt.Printf("%s  arrived   %s, published before this run: acked\n", clock(a.at), a.id)
				continue
			}
			arrived++
			if s.due.Equal(s.published) {
				fmt.Printf("%s  arrived   #%d %s  not delayed: %s after Publish\n", clock(a.at), s.seq, s.id,
					a.at.Sub(s.published).Round(100*time.Microsecond))
				continue
			}
			late := a.at.Sub(s.due)
			verdict := fmt.Sprintf("%s late", late.Round(100*time.Microsecond))
			if late < 0 {
				verdict = fmt.Sprintf("%s EARLY", (-late).Round(100*time.Microsecond))
			}
			fmt.Printf("%s  arrived   #%d %s  requested %s  actual %s  %s\n", clock(a.at), s.seq, s.id,
				requested(o), a.at.Sub(s.published).Round(time.Millisecond), verdict)
		case <-timeout:
			return fmt.Errorf("%d of %d messages arrived within 30s of the last one's due time (another consumer may have taken them)",
				arrived, o.count)
		}
	}
	if err := r.Close(); err != nil {
		return err
	}
	if existed {
		fmt.Printf("%s; %s stays (it existed before this run)\n", allArrived(o.count), o.queue)
		return nil
	}
	deleted, err := deleteIfUnused(url, o.queue)
	if err != nil {
		return err
	}
	if deleted {
		fmt.Printf("%s; deleted %s (this run created it)\n", allArrived(o.count), o.queue)
	} else {
		fmt.Printf("%s; %s stays: it is in use now\n", allArrived(o.count), o.queue)
	}
	return nil
}

// requested is the delay asked for, as the user wrote it.
func requested(o options) string {
	switch {
	case o.delay > 0:
		return o.delay.String()
	case !o.at.IsZero():
		return "at " + clock(o.at)
	}
	return "no delay"
}

// inspect reports whether queue exists and, if it does, how many consumers it has.
func inspect(url, queue string) (exists bool, consumers int, err error) {
	c, err := amqp.Dial(firstNode(url))
	if err != nil {
		return false, 0, err
	}
	defer c.Close()
	ch, err := c.Channel()
	if err != nil {
		return false, 0, err
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, err
	}
	return true, q.Consumers, nil
}

// deleteIfUnused deletes queue, its poison queue and kill exchange if the queue has no
// message and no consumer (quorum queues cannot be deleted "if empty" by the broker: it is
// checked just before).
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

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func allArrived(n int) string {
	if n == 1 {
		return "it arrived"
	}
	return fmt.Sprintf("all %d arrived", n)
}

func pronoun(n int) string {
	if n == 1 {
		return "it"
	}
	return "them"
}

// clock is t as a UTC wall-clock time, to the millisecond.
func clock(t time.Time) string { return t.UTC().Format("15:04:05.000") }

// firstNode is the first URL of a list of a cluster's nodes (warren's components take the
// whole list; amqp091's Dial one URL).
func firstNode(url string) string {
	first, _, _ := strings.Cut(url, ",")
	return first
}
