package testenv

import (
	"slices"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
)

// HostileHeaders returns header tables that RabbitMQ accepts from a publisher and amqp091-go
// cannot read when they are delivered (it closes the connection): a table nested 33 deep,
// 8,193 headers, an array of 8,193 elements, and ("large_header") one string header that
// fills a frame to the broker's limit, so that it exceeds frame_max as soon as the broker adds
// a header of its own (x-death when it is dead-lettered, x-delivery-count when a quorum queue
// redelivers it). InjectHostile publishes them so that each is unreadable on its first
// delivery.
func HostileHeaders() map[string]amqp.Table {
	deep, many := NestedTable(33), ManyHeaders(8193)
	// A header frame payload of 131,060 bytes with a 7-byte message id and delivery mode 2:
	// 14 bytes of class, weight, size and flags, the table (4 + 2 + 1 + 4 + len), delivery
	// mode (1) and message id (1 + 7). The broker accepts up to frame_max-8 (131,064).
	return map[string]amqp.Table{
		"nested_33_deep": deep,
		"8193_headers":   many,
		"array_of_8193":  {"arr": make([]any, 8193)},
		"large_header":   {"h": strings.Repeat("x", 131060-34)},
	}
}

// NestedTable returns a header table with tables nested depth deep (amqp091-go reads 32).
func NestedTable(depth int) amqp.Table {
	t := amqp.Table{"leaf": "x"}
	for range depth {
		t = amqp.Table{"n": t}
	}
	return t
}

// ManyHeaders returns a header table of n entries (amqp091-go reads 8,192).
func ManyHeaders(n int) amqp.Table {
	t := amqp.Table{}
	for i := range n {
		t["h"+strconv.Itoa(i)] = "v"
	}
	return t
}

// InjectHostile publishes the HostileHeaders messages of the given names (all when none are
// given) into queue with message id "hostile", persistent, its name as the body, confirmed;
// "large_header" through a dead-letter hop (queue+".hop", removed when the test ends, with a
// TTL of 0 that dead-letters into queue), which adds x-death. It returns the names.
func (e *Env) InjectHostile(queue string, only ...string) []string {
	e.t.Helper()
	hop := queue + ".hop"
	e.Remove([]string{hop}, nil)
	ch := e.Channel()
	if _, err := ch.QueueDeclare(hop, true, false, false, false, amqp.Table{
		"x-message-ttl": int32(0), "x-dead-letter-exchange": "", "x-dead-letter-routing-key": queue,
	}); err != nil {
		e.t.Fatalf("declare %s: %v", hop, err)
	}
	if err := ch.Confirm(false); err != nil {
		e.t.Fatal(err)
	}
	var names []string
	for name, h := range HostileHeaders() {
		if len(only) > 0 && !slices.Contains(only, name) {
			continue
		}
		key := queue
		if name == "large_header" {
			key = hop
		}
		dc, err := ch.PublishWithDeferredConfirm("", key, true, false, amqp.Publishing{
			MessageId: "hostile", Headers: h, Body: []byte(name), DeliveryMode: amqp.Persistent,
		})
		if err != nil {
			e.t.Fatalf("inject %s: %v", name, err)
		}
		if ok, err := dc.WaitContext(e.t.Context()); err != nil || !ok {
			e.t.Fatalf("inject %s: not confirmed: %v", name, err)
		}
		names = append(names, name)
	}
	return names
}
