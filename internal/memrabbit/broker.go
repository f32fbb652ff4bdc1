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
	"reflect"
	"slices"
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

// maxMessageSize is the largest body the broker takes, by default: 128 MiB on 3.10, 16 MiB
// from 4.0.
func (b *Broker) maxMessageSize() uint64 {
	if b.atLeast(4, 0) {
		return 16 << 20
	}
	return 128 << 20
}

// Broker is one in-memory RabbitMQ node with a single virtual host.
type Broker struct {
	cfg          Config
	major, minor int // cfg.Version's
	mu           sync.Mutex
	exchanges    map[string]*exchange
	queues       map[string]*queue
	consumed     []*queue // the queues that have a consumer: the ones dispatchLocked delivers from
	conns        map[*conn]bool
	replies      map[string]*channel // the channels that consume amq.rabbitmq.reply-to, by their reply address
	closed       bool
	expiring     expiring      // the queues whose head expires, soonest first
	armSeq       uint64        // counts the expirations set
	wake         chan struct{} // wakes the expirer when the soonest expiration changes; nil: none runs
	seq          int           // for server-named queues and consumer tags
	enqueued     uint64        // counts the messages queues took

	host       string // the host of URL
	unregister func()
	journal    [][]entry // in arrays of journalChunk
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
	if b.wake != nil {
		select {
		case b.wake <- struct{}{}: // the expirer ends
		default:
		}
	}
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

	// What routing matches, taken from key and args when the binding is made.
	pattern  []string    // a topic binding's words
	match    []headerArg // a headers binding's arguments that are matched: not x-match, none starting with "x-" but with all-with-x or any-with-x
	matchAny bool        // a headers binding's x-match is any (or any-with-x)
}

// headerArg is a header a headers binding matches: want nil matches any value.
type headerArg struct {
	key  string
	want any
}

// newBinding returns a binding of dest to an exchange, with what routing matches.
func newBinding(dest string, toExchange bool, key string, args Table) binding {
	bd := binding{queue: dest, toExchange: toExchange, key: key, args: args, pattern: words(key)}
	mode, _ := args["x-match"].(string)
	bd.matchAny = strings.HasPrefix(mode, "any")
	withX := strings.HasSuffix(mode, "-with-x")
	for k, want := range args {
		if k != "x-match" && (withX || !strings.HasPrefix(k, "x-")) {
			bd.match = append(bd.match, headerArg{key: k, want: want})
		}
	}
	return bd
}

// routeLocked returns the queues a message published to exchange x with key, further keys
// (its CC and BCC headers') and properties props goes to, each once: through the exchanges bound to x,
// and to x's alternate exchange (and its own) when nothing else takes it.
func (b *Broker) routeLocked(x *exchange, key string, more []string, props *properties) []*queue {
	if x.name == "" { // the default exchange: to the queues the keys name
		var out []*queue
		for _, k := range append([]string{key}, more...) {
			if q, ok := b.queues[k]; ok && !slices.Contains(out, q) {
				out = append(out, q)
			}
		}
		return out
	}
	r := route{b: b, key: key, more: more, props: props}
	r.walk(x)
	return r.out
}

// route is one routing of a message: the exchanges it went through and the queues it
// reached, each once.
type route struct {
	b     *Broker
	key   string
	more  []string // further keys (CC and BCC)
	words []string // the key's, split when a topic exchange first needs them
	props *properties
	seen  []*exchange
	out   []*queue
}

// walk routes through x, and reports whether any queue, or exchange that routed it, took
// the message.
func (r *route) walk(x *exchange) bool {
	if slices.Contains(r.seen, x) {
		return false
	}
	r.seen = append(r.seen, x)
	routed := false
	for i := range x.bindings {
		bd := &x.bindings[i]
		if !r.matches(x, bd) {
			continue
		}
		if bd.toExchange {
			if to, ok := r.b.exchanges[bd.queue]; ok && r.walk(to) {
				routed = true
			}
			continue
		}
		q, ok := r.b.queues[bd.queue]
		if !ok {
			continue
		}
		routed = true
		if !slices.Contains(r.out, q) {
			r.out = append(r.out, q)
		}
	}
	if !routed {
		if ae, ok := x.args["alternate-exchange"].(string); ok {
			if to, ok := r.b.exchanges[ae]; ok {
				routed = r.walk(to)
			}
		}
	}
	return routed
}

// matches reports whether binding bd of exchange x takes the message.
func (r *route) matches(x *exchange, bd *binding) bool {
	switch x.kind {
	case "fanout":
		return true
	case "topic":
		if r.words == nil && r.key != "" {
			r.words = words(r.key)
		}
		return topicMatch(bd.pattern, r.words) ||
			slices.ContainsFunc(r.more, func(k string) bool { return topicMatch(bd.pattern, words(k)) })
	case "headers":
		return headersMatch(bd, r.props, !r.b.atLeast(4, 0))
	default:
		return bd.key == r.key || slices.Contains(r.more, bd.key)
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
// with "x-" are matched only with all-with-x or any-with-x) against a message's headers.
func headersMatch(bd *binding, props *properties, acrossNumbers bool) bool {
	matched := 0
	for _, a := range bd.match {
		got, ok := props.lookup(a.key)
		if ok && (a.want == nil || sameValue(a.want, got, acrossNumbers)) {
			if bd.matchAny {
				return true
			}
			matched++
		} else if !bd.matchAny {
			return false
		}
	}
	return !bd.matchAny && matched == len(bd.match)
}

// sameValue reports whether a binding's value and a header's are the same, as RabbitMQ's
// headers exchange compares them: strings and byte strings by their bytes, integers of any
// width by their value, floats and doubles by theirs (and across the two, acrossNumbers, as
// 3.10 does), anything else only with a value of its own type (the string "2" is not the
// integer 2; measured on 3.10.8 and 4.0.5).
func sameValue(want, got any, acrossNumbers bool) bool {
	if w, ok := bytesArg(want); ok { // the common case: the delay levels' digits
		g, ok := bytesArg(got)
		return ok && w == g
	}
	wi, wInt := intArg(want)
	gi, gInt := intArg(got)
	wf, wFloat := floatArg(want)
	gf, gFloat := floatArg(got)
	switch {
	case wInt && gInt:
		return wi == gi
	case wFloat && gFloat:
		return wf == gf
	case wInt && gFloat && acrossNumbers:
		return float64(wi) == gf
	case wFloat && gInt && acrossNumbers:
		return wf == float64(gi)
	case wInt || wFloat:
		return false
	}
	return reflect.TypeOf(want) == reflect.TypeOf(got) && reflect.DeepEqual(want, got)
}

// bytesArg returns a string or a byte string, as a string.
func bytesArg(v any) (string, bool) {
	switch b := v.(type) {
	case string:
		return b, true
	case []byte:
		return string(b), true
	}
	return "", false
}

// floatArg returns a float or a double.
func floatArg(v any) (float64, bool) {
	switch f := v.(type) {
	case float32:
		return float64(f), true
	case float64:
		return f, true
	}
	return 0, false
}
