// Package warrentest runs warren's components in a test against an in-memory RabbitMQ on a
// fake clock: no broker to start, and a test of a retry after a day, or of a message due in
// ten years, takes milliseconds.
//
// Run runs a test inside a testing/synctest bubble with a new Broker. Everything the test
// starts (routers, publishers, the scheduler, rpc clients) reaches the broker through
// Broker.Connection, and is the same code that runs against RabbitMQ: the broker speaks
// AMQP 0-9-1 over in-memory connections, with exchanges, bindings, queues, TTLs,
// dead-lettering, delivery limits, single active consumers and streams as RabbitMQ has them
// (3.10 by default, or 4.0: Config.Version). Time in the bubble is fake: it moves when every
// goroutine of the test waits, and then straight to the next timer, so a delay of a year
// takes no longer than one of a second. Broker.Advance moves it on; Broker.Idle waits until
// nothing can happen without it moving.
//
// What the broker did is kept in its journal (Broker.Journal), which Run prints when the
// test fails; Published and Delivered answer the usual questions from it, Poisoned from what
// waits in a poison queue.
package warrentest

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/memrabbit"
	"github.com/warrenmq/warren/topology"
)

// Config configures the broker of Run.
type Config struct {
	// Version is the RabbitMQ version whose behaviour the broker follows where versions
	// differ: "3.10" (default) or "4.0" (among others, a quorum queue's default delivery limit
	// of 20, its two message priorities, its returns given out first, the x-last-death-*
	// headers; docs/testing.md lists them).
	Version string
}

// Validate reports an unknown Version.
func (c Config) Validate() error {
	switch c.Version {
	case "", "3.10", "4.0":
		return nil
	}
	return fmt.Errorf("warrentest: Config.Version %q: want 3.10 or 4.0", c.Version)
}

// Broker is an in-memory RabbitMQ of one test (see Run).
type Broker struct {
	b *memrabbit.Broker
}

// Run runs test in a testing/synctest bubble, with a new Broker that is closed after test
// and its cleanups (t.Cleanup) have returned. Everything test starts must have ended by then
// (routers and clients closed, goroutines returned), as synctest requires: close them in
// test or in its cleanups. If test fails, Run logs the broker's journal.
func Run(t *testing.T, cfg Config, test func(t *testing.T, b *Broker)) {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		b := &Broker{b: memrabbit.New(memrabbit.Config{Version: cfg.Version})}
		t.Cleanup(func() { // the first registered: it runs after the test's own
			if t.Failed() {
				t.Log("what the broker did:\n" + b.String())
			}
			_ = b.b.Close()
		})
		test(t, b)
	})
}

// Connection is what warren's components connect with to reach the broker.
func (b *Broker) Connection() warren.Connection { return warren.Connection{URL: b.b.URL()} }

// URL is the broker's URL: only this process's warren components can reach it.
func (b *Broker) URL() string { return b.b.URL() }

// Dial opens a connection to the broker for a client other than warren's components: an
// in-memory net.Conn that speaks AMQP 0-9-1. With amqp091-go:
//
//	amqp.DialConfig(b.URL(), amqp.Config{Dial: func(string, string) (net.Conn, error) { return b.Dial() }})
func (b *Broker) Dial() (net.Conn, error) { return b.b.Dial() }

// Idle waits until no message is in flight: none delivered and not yet settled, none waiting
// in a queue that has a consumer. What waits in a queue no one consumes (a delay level, a
// poison queue) is not in flight. It moves the clock on as little as that takes: a
// consumer's acks go out a few milliseconds after its handler returns, and a handler may
// wait on a timer of its own (it moves in steps that double up to a second, for at most an
// hour). It must be called from the test's own goroutine.
func (b *Broker) Idle() {
	synctest.Wait()
	start := time.Now()
	for step := time.Millisecond; b.b.InFlight() > 0 && time.Since(start) < time.Hour; step = min(2*step, time.Second) {
		time.Sleep(step)
		synctest.Wait()
	}
}

// Advance moves the fake clock on by d (everything due meanwhile happens, in order), then
// waits until no message is in flight (see Idle).
func (b *Broker) Advance(d time.Duration) {
	time.Sleep(d)
	b.Idle()
}

// Message is a message as the broker saw it at an event.
type Message struct {
	At         time.Time // when (the fake clock)
	ID         string    // its message id (warren's message UUID)
	Exchange   string
	RoutingKey string
	Headers    map[string]any
	Body       []byte
}

// Event is one thing the broker did: Kind is published, delivered, acked, requeued,
// rejected, dead-lettered or dropped; Queue is the queue it happened in (for all but
// published), Reason why a message was dead-lettered or dropped (expired, rejected,
// maxlen, delivery_limit).
type Event struct {
	Message
	Kind   string
	Queue  string
	Reason string
}

// String is the event on one line.
func (e Event) String() string { return e.memrabbit().String() }

func (e Event) memrabbit() memrabbit.Event {
	return memrabbit.Event{At: e.At, Kind: e.Kind, Exchange: e.Exchange, RoutingKey: e.RoutingKey, Queue: e.Queue,
		Reason: e.Reason, MessageID: e.ID}
}

// Journal returns what the broker did so far, in order.
func (b *Broker) Journal() []Event {
	var out []Event
	for _, e := range b.b.Journal() {
		out = append(out, Event{Message: Message{At: e.At, ID: e.MessageID, Exchange: e.Exchange, RoutingKey: e.RoutingKey,
			Headers: e.Headers, Body: e.Body}, Kind: e.Kind, Queue: e.Queue, Reason: e.Reason})
	}
	return out
}

// String is the journal, an event a line.
func (b *Broker) String() string {
	var s strings.Builder
	for _, e := range b.Journal() {
		s.WriteString(e.String())
		s.WriteByte('\n')
	}
	return s.String()
}

// Published returns the messages published to to: an exchange, or a queue (through the
// default exchange, as warren's publisher sends to a queue), in order. A message warren
// delays is published to its delay levels first: it is listed once it is delivered to to.
func (b *Broker) Published(to string) []Message {
	var out []Message
	for _, e := range b.Journal() {
		if e.Kind == "published" && (e.Exchange == to || e.Exchange == "" && e.RoutingKey == to) {
			out = append(out, e.Message)
		}
	}
	return out
}

// Delivery is a message delivered to a consumer of a queue, with its warren attempt (1 for
// the first, from the warren_attempt header).
type Delivery struct {
	Message
	Attempt int
}

// Delivered returns the messages delivered to the consumers of queue, in order: each
// attempt of a handler is one.
func (b *Broker) Delivered(queue string) []Delivery {
	var out []Delivery
	for _, e := range b.Journal() {
		if e.Kind == "delivered" && e.Queue == queue {
			attempt := 1
			if s, ok := e.Headers[warren.AttemptKey].(string); ok {
				if n, err := strconv.Atoi(s); err == nil {
					attempt = n
				}
			}
			out = append(out, Delivery{Message: e.Message, Attempt: attempt})
		}
	}
	return out
}

// Poison is a message in a queue's poison queue, and why it is there.
type Poison struct {
	Message
	Reason   string // warren.PoisonReason*
	Error    string // the handler's last error
	Attempts int
}

// Poisoned returns the messages waiting in the poison queue of queue
// (topology.PoisonQueue), in order.
func (b *Broker) Poisoned(queue string) []Poison {
	var out []Poison
	for _, e := range b.b.Messages(topology.PoisonQueue(queue)) {
		p := Poison{Message: Message{ID: e.MessageID, Exchange: e.Exchange, RoutingKey: e.RoutingKey, Headers: e.Headers, Body: e.Body}}
		p.Reason, _ = e.Headers[warren.PoisonReasonKey].(string)
		p.Error, _ = e.Headers[warren.PoisonErrorKey].(string)
		if s, ok := e.Headers[warren.PoisonAttemptsKey].(string); ok {
			p.Attempts, _ = strconv.Atoi(s)
		}
		out = append(out, p)
	}
	return out
}
