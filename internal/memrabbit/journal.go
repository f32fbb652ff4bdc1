package memrabbit

import (
	"fmt"
	"strings"
	"time"
)

// Event is one thing the broker did with a message, as its journal records it.
type Event struct {
	At         time.Time
	Kind       string // published, delivered, acked, requeued, rejected, dead-lettered, dropped, returned
	Exchange   string // published: where to; dead-lettered: the dead-letter exchange
	RoutingKey string
	Queue      string // delivered, acked, requeued, rejected, dead-lettered: the queue
	Reason     string // dead-lettered: expired, rejected, maxlen, delivery_limit
	MessageID  string
	Headers    Table
	Body       []byte
}

// String is one line: when, what, which message, where.
func (e Event) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %-13s", e.At.Format("2006-01-02 15:04:05.000"), e.Kind)
	if e.MessageID != "" {
		fmt.Fprintf(&b, " %s", e.MessageID)
	}
	switch e.Kind {
	case "published", "returned":
		fmt.Fprintf(&b, " to exchange %q, key %q", e.Exchange, e.RoutingKey)
	default:
		fmt.Fprintf(&b, " in %s", e.Queue)
	}
	if e.Reason != "" {
		fmt.Fprintf(&b, " (%s)", e.Reason)
	}
	return b.String()
}

// entry is an event as the journal keeps it: the Event takes the message's fields when the
// journal is read (a stored message does not change).
type entry struct {
	at     time.Time
	kind   string
	msg    *stored
	queue  string
	reason string
}

// journalChunk is how many entries each array of the journal holds: it grows by arrays of
// its own rather than by copying one.
const journalChunk = 1024

// recordLocked adds an event about msg to the journal.
func (b *Broker) recordLocked(kind string, msg *stored, queue, reason string) {
	if n := len(b.journal); n == 0 || len(b.journal[n-1]) == journalChunk {
		b.journal = append(b.journal, make([]entry, 0, journalChunk))
	}
	last := &b.journal[len(b.journal)-1]
	*last = append(*last, entry{at: time.Now(), kind: kind, msg: msg, queue: queue, reason: reason})
}

// Journal returns what the broker did, in order.
func (b *Broker) Journal() []Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []Event
	for _, chunk := range b.journal {
		for _, e := range chunk {
			out = append(out, Event{At: e.at, Kind: e.kind, Exchange: e.msg.exchange, RoutingKey: e.msg.routingKey,
				Queue: e.queue, Reason: e.reason, MessageID: e.msg.props.MessageId, Headers: e.msg.props.headers(), Body: e.msg.body})
		}
	}
	return out
}

// Messages returns the messages waiting in queue (not those delivered and unacknowledged),
// in order, as events of kind "waiting"; nil if there is no such queue.
func (b *Broker) Messages(queue string) []Event {
	b.mu.Lock()
	defer b.mu.Unlock()
	q, ok := b.queues[queue]
	if !ok {
		return nil
	}
	out := []Event{}
	for _, qd := range q.ready {
		out = append(out, Event{Kind: "waiting", Exchange: qd.msg.exchange, RoutingKey: qd.msg.routingKey, Queue: queue,
			MessageID: qd.msg.props.MessageId, Headers: qd.msg.props.headers(), Body: qd.msg.body})
	}
	return out
}

// InFlight counts the messages on their way to or in a consumer: delivered and not settled,
// waiting in a queue that has a consumer, or in a stream one of its consumers has not read.
// What waits in a queue no one consumes (a delay level, a poison queue) is not in flight.
func (b *Broker) InFlight() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for c := range b.conns {
		for _, ch := range c.channels {
			n += len(ch.tags)
		}
	}
	for _, q := range b.queues {
		if len(q.consumers) > 0 {
			n += len(q.ready)
		}
		for _, cs := range q.consumers {
			if q.stream {
				n += len(q.log) - cs.offset
			}
		}
	}
	return n
}
