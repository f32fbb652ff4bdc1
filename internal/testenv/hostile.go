package testenv

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
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

// ForgedXDeath is the x-death header that stops dead-lettering on RabbitMQ 3.10.8 (see
// amqpx.DeadLetterWarning): an array of strings where the broker expects tables.
var ForgedXDeath = []any{"forged", warren.XDeathHeader}

// BreakDeadLettering publishes one persistent message with ForgedXDeath into queue q of the
// node, straight through the default exchange, confirmed, with contract.DestQueueHeader set
// to dest; q is a delay level whose short TTL dead-letters it at once towards dest (such as
// LevelQueue(0, 1)), and dest an empty queue. It then waits, for up to a minute, until
// either the node refuses to declare a quorum queue that dead-letters at least once (541
// INTERNAL_ERROR: its dead-letter worker's supervisor gave up, as on 3.10.8) or the message
// has arrived in dest (as on 4.0.5), and reports whether dead-lettering broke. A method of a
// throwaway Node only: never do this to a shared broker, it stays broken (a restart does not
// mend it: see docs/dead-lettering.md). It fails the test on error.
func (n *Node) BreakDeadLettering(q, dest string) (broken bool) {
	n.t.Helper()
	var conn *amqp.Connection
	defer func() {
		if conn != nil {
			_ = conn.Close()
		}
	}()
	// channel opens a channel, on a new connection when the last one was closed: the broker
	// closes the connection on a 541, which a delete in the loop below can get.
	channel := func() *amqp.Channel {
		if conn == nil || conn.IsClosed() {
			c, err := amqp.Dial(n.URL())
			if err != nil {
				n.t.Fatalf("node %s: %v", n.name, err)
			}
			conn = c
		}
		ch, err := conn.Channel()
		if err != nil {
			n.t.Fatalf("node %s: %v", n.name, err)
		}
		return ch
	}
	ch := channel()
	if err := ch.Confirm(false); err != nil {
		n.t.Fatal(err)
	}
	dc, err := ch.PublishWithDeferredConfirm("", q, true, false, amqp.Publishing{
		MessageId: "forged", Body: []byte("forged x-death"), DeliveryMode: amqp.Persistent,
		Headers: amqp.Table{warren.XDeathHeader: ForgedXDeath, contract.DestQueueHeader: dest},
	})
	if err != nil {
		n.t.Fatalf("forge into %s: %v", q, err)
	}
	if !dc.Wait() {
		n.t.Fatalf("forge into %s: nacked", q)
	}
	_ = ch.Close()
	canary := "warren.probe." + newCookie()[:8]
	deadline := time.Now().Add(Patience())
	for time.Now().Before(deadline) {
		ch := channel()
		_, err = ch.QueueDeclare(canary, true, false, false, false, amqp.Table{
			amqp.QueueTypeArg: amqp.QueueTypeQuorum, "x-dead-letter-exchange": "",
			"x-dead-letter-strategy": "at-least-once", amqp.QueueOverflowArg: amqp.QueueOverflowRejectPublish,
		})
		var ae *amqp.Error
		switch {
		case errors.As(err, &ae) && ae.Code == amqp.InternalError:
			n.deleteQueue(canary) // left down
			return true
		case err != nil:
			n.t.Fatalf("node %s: declare %s: %v", n.name, canary, err)
		}
		// The worker may stop between the declare and the delete, which the broker then
		// refuses (and closes the connection): the next turn's declare tells.
		_, _ = ch.QueueDelete(canary, false, false, false)
		_ = ch.Close()
		ch = channel()
		info, err := ch.QueueDeclarePassive(dest, true, false, false, false, nil)
		if err != nil {
			n.t.Fatalf("node %s: %s: %v", n.name, dest, err)
		}
		_ = ch.Close()
		if info.Messages > 0 {
			return false
		}
		time.Sleep(100 * time.Millisecond) // the broker's dead-letter worker, not ours to wait on
	}
	n.t.Fatalf("node %s: after %s the forged message has not reached %s and dead-lettering is not refused", n.name, Patience(), dest)
	return false
}

// deleteQueue deletes queue q of the node, on a connection of its own, ignoring errors.
func (n *Node) deleteQueue(q string) {
	c, err := amqp.Dial(n.URL())
	if err != nil {
		return
	}
	defer c.Close()
	if ch, err := c.Channel(); err == nil {
		_, _ = ch.QueueDelete(q, false, false, false)
	}
}

// QueueMessages is the number of messages in queue q of the node as rabbitmqctl
// list_queues counts them: all of them, ready, unacknowledged, and those a quorum queue
// is dead-lettering (a passive declare counts the ready ones alone). It fails the test if q
// is not listed.
func (n *Node) QueueMessages(q string) int {
	n.t.Helper()
	for _, row := range n.ListQueues() {
		if row.Name == q {
			return row.Messages
		}
	}
	n.t.Fatalf("node %s: no queue %s", n.name, q)
	return 0
}

// QueueRow is a queue as rabbitmqctl list_queues shows it.
type QueueRow struct {
	Name  string
	State string // running, down, ...
	// Messages counts them all (see QueueMessages).
	Messages int
}

// ListQueues lists the queues of the node's default virtual host with rabbitmqctl; it fails
// the test on error.
func (n *Node) ListQueues() []QueueRow {
	n.t.Helper()
	out, err := n.Ctl("list_queues", "--quiet", "--no-table-headers", "name", "state", "messages")
	if err != nil {
		n.t.Fatalf("node %s: %v\n%s", n.name, err, out)
	}
	var rows []QueueRow
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 3 {
			continue
		}
		m, err := strconv.Atoi(strings.TrimSpace(f[2]))
		if err != nil {
			continue
		}
		rows = append(rows, QueueRow{Name: f[0], State: f[1], Messages: m})
	}
	return rows
}
