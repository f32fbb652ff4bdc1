// Package memrabbit is a RabbitMQ broker in the test process: it speaks AMQP 0-9-1 to
// amqp091-go over in-memory connections (newPipe), so that warren's components run on it
// unchanged, and keeps its exchanges, bindings and queues in memory. Its timers are Go
// timers: inside a testing/synctest bubble they run on the bubble's fake clock.
//
// The frame codec (spec091.go, read.go, write.go, types.go) is amqp091-go's, under its
// licence (LICENSE in this directory).
package memrabbit

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/warrenmq/warren/internal/amqpx"
)

// Config configures a Broker.
type Config struct {
	// Version is the RabbitMQ version whose behaviour the broker follows where versions
	// differ: "3.10" (the default) or "4.0".
	Version string
}

// atLeast reports whether the broker follows version major.minor or later.
func (b *Broker) atLeast(major, minor int) bool {
	return b.major > major || b.major == major && b.minor >= minor
}

// Broker is one in-memory RabbitMQ node with a single virtual host.
type Broker struct {
	cfg          Config
	major, minor int // cfg.Version's
	mu           sync.Mutex
	exchanges    map[string]*exchange
	queues       map[string]*queue
	conns        map[*conn]bool
	replies      map[string]*channel // the channels that consume amq.rabbitmq.reply-to, by their reply address
	closed       bool
	seq          int // for server-named queues and consumer tags

	host       string // the host of URL
	unregister func()
	journal    []Event
}

// brokers numbers the brokers of the process, whose URLs differ by it.
var brokers atomic.Int64

// New returns a broker with RabbitMQ's predeclared exchanges.
func New(cfg Config) *Broker {
	if cfg.Version == "" {
		cfg.Version = "3.10"
	}
	b := &Broker{cfg: cfg, exchanges: map[string]*exchange{}, queues: map[string]*queue{}, conns: map[*conn]bool{},
		replies: map[string]*channel{}}
	_, _ = fmt.Sscanf(cfg.Version, "%d.%d", &b.major, &b.minor)
	for name, kind := range map[string]string{
		"": "direct", "amq.direct": "direct", "amq.fanout": "fanout", "amq.topic": "topic",
		"amq.headers": "headers", "amq.match": "headers",
	} {
		b.exchanges[name] = &exchange{name: name, kind: kind, durable: true}
	}
	b.host = fmt.Sprintf("memrabbit-%d.invalid", brokers.Add(1))
	b.unregister = amqpx.RegisterBroker(b.host, b.Dial)
	return b
}

// URL is the broker's URL: warren's components given it (warren.Connection.URL) reach the
// broker as they reach RabbitMQ; nothing else can. It asks for no heartbeats: on a fake
// clock that jumps a year, they would be millions of frames.
func (b *Broker) URL() string { return "amqp://guest:guest@" + b.host + ":5672/?heartbeat=0" }

// Dial connects to the broker: it returns the client's end of a new in-memory connection,
// and serves the other end until either closes.
func (b *Broker) Dial() (net.Conn, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, fmt.Errorf("memrabbit: the broker is closed")
	}
	server, client := newPipe()
	c := newConn(b, server)
	b.conns[c] = true
	go c.serve()
	return client, nil
}

// Close closes every connection and refuses new ones.
func (b *Broker) Close() error {
	b.unregister()
	b.mu.Lock()
	b.closed = true
	conns := make([]*conn, 0, len(b.conns))
	for c := range b.conns {
		conns = append(conns, c)
	}
	b.mu.Unlock()
	for _, c := range conns {
		_ = c.nc.Close()
	}
	return nil
}

// exchange routes what is published to it to the queues bound to it.
type exchange struct {
	name       string
	kind       string // direct, fanout, topic, headers
	durable    bool
	autoDelete bool
	internal   bool
	args       Table
	bindings   []binding
}

// binding binds a queue, or an exchange, to an exchange.
type binding struct {
	queue      string // the queue, or the exchange when toExchange
	toExchange bool
	key        string
	args       Table
}

// routeLocked returns the queues a message published to exchange x with key and headers
// goes to, each once: through the exchanges bound to x, and to x's alternate exchange (and
// its own) when nothing else takes it.
func (b *Broker) routeLocked(x *exchange, key string, headers Table) []*queue {
	if x.name == "" { // the default exchange: to the queue the key names
		if q, ok := b.queues[key]; ok {
			return []*queue{q}
		}
		return nil
	}
	var out []*queue
	seenQ, seenX := map[string]bool{}, map[string]bool{}
	var walk func(x *exchange) bool
	walk = func(x *exchange) bool {
		if seenX[x.name] {
			return false
		}
		seenX[x.name] = true
		routed := false
		for _, bd := range x.bindings {
			if !x.matches(bd, key, headers) {
				continue
			}
			if bd.toExchange {
				if to, ok := b.exchanges[bd.queue]; ok && walk(to) {
					routed = true
				}
				continue
			}
			q, ok := b.queues[bd.queue]
			if !ok {
				continue
			}
			routed = true
			if !seenQ[q.name] {
				seenQ[q.name] = true
				out = append(out, q)
			}
		}
		if !routed {
			if ae, ok := x.args["alternate-exchange"].(string); ok {
				if to, ok := b.exchanges[ae]; ok {
					routed = walk(to)
				}
			}
		}
		return routed
	}
	walk(x)
	return out
}

func (x *exchange) matches(bd binding, key string, headers Table) bool {
	switch x.kind {
	case "fanout":
		return true
	case "topic":
		return topicMatch(words(bd.key), words(key))
	case "headers":
		return headersMatch(bd.args, headers)
	default:
		return bd.key == key
	}
}

// words splits a routing key or topic pattern into its words: none for "".
func words(key string) []string {
	if key == "" {
		return nil
	}
	return strings.Split(key, ".")
}

// topicMatch matches a topic binding's words against a routing key's: * is one word, # zero
// or more.
func topicMatch(pattern, words []string) bool {
	if len(pattern) == 0 {
		return len(words) == 0
	}
	switch pattern[0] {
	case "#":
		for i := 0; i <= len(words); i++ {
			if topicMatch(pattern[1:], words[i:]) {
				return true
			}
		}
		return false
	case "*":
		return len(words) > 0 && topicMatch(pattern[1:], words[1:])
	default:
		return len(words) > 0 && words[0] == pattern[0] && topicMatch(pattern[1:], words[1:])
	}
}

// headersMatch matches a headers binding (x-match all, the default, or any; keys that start
// with "x-" are not matched) against a message's headers.
func headersMatch(args, headers Table) bool {
	mode, _ := args["x-match"].(string)
	any := strings.HasPrefix(mode, "any")
	matched, tried := 0, 0
	for k, want := range args {
		if strings.HasPrefix(k, "x-") {
			continue
		}
		tried++
		got, ok := headers[k]
		if ok && (want == nil || sameValue(want, got)) {
			matched++
		}
	}
	if any {
		return matched > 0
	}
	return matched == tried
}

// sameValue reports whether a binding's value and a header's are the same, as text: strings
// (the delay levels' digits) are compared as they are, other values as fmt prints them.
func sameValue(want, got any) bool {
	if w, ok := want.(string); ok {
		if g, ok := got.(string); ok {
			return w == g
		}
	}
	return fmt.Sprint(want) == fmt.Sprint(got)
}
