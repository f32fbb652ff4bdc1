//go:build faults

package faults

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/testenv"
)

// (a) The broker is killed with SIGKILL and restarted while the stream flows.
func TestBrokerKill9(t *testing.T) {
	h := newHarness(t, "broker_kill9", streamSize)
	h.stream()
	h.awaitSent(h.size * 2 / 5)
	h.crashBroker()
	h.finish()
}

// (b) Every connection to the broker is closed 20 times, spaced over the stream. A close
// takes rabbitmqctl up to a second or more on a busy machine: the stream is held until
// the last one has happened, and flows for a second after it.
func TestConnectionsClosed(t *testing.T) {
	const closes = 20
	h := newHarness(t, "connections_closed", streamSize)
	release := h.hold()
	h.stream()
	closedRE := regexp.MustCompile(`Closed (\d+) connections`)
	total := 0
	for k := 1; k <= closes; k++ {
		h.awaitSent(h.size * k / (closes + 1))
		h.during(fmt.Sprintf("close %d", k))
		// node.CloseAllConnections, with the count of connections it closed.
		out, err := h.node.Ctl("close_all_connections", "--global", "faults")
		m := closedRE.FindStringSubmatch(out)
		if err != nil || m == nil {
			t.Fatalf("close_all_connections: %v\n%s", err, out)
		}
		n, _ := strconv.Atoi(m[1])
		total += n
		h.event(fmt.Sprintf("closed %d connections", n))
		h.mark()
	}
	h.awaitSent(int(h.sent.Load()) + streamRate)
	release()
	t.Logf("%d closes closed %d connections", closes, total)
	if total < closes {
		t.Fatalf("%d closes closed only %d connections: the consumers were not connected", closes, total)
	}
	h.finish()
}

// (c) A consumer process is killed with SIGKILL mid-stream; a replacement starts.
func TestConsumerKill9(t *testing.T) {
	h := newHarness(t, "consumer_kill9", streamSize)
	h.stream()
	h.awaitSent(h.size * 2 / 5)
	victim := h.live()[0]
	if victim.oks.Load() == 0 {
		t.Fatalf("consumer %s processed nothing before it was to be killed", victim.name)
	}
	h.kill9(victim)
	h.mark()
	t.Logf("consumer %s killed after %d messages", victim.name, victim.oks.Load())
	h.startConsumer().awaitReady(t)
	h.event("replacement ready")
	h.finish()
	t.Logf("%d messages in the handlers of %s when it was killed were handled again elsewhere", h.redelivered(victim), victim.name)
}

// (d) Messages that amqp091-go cannot parse (the broker takes them) are injected into the
// work queue during the stream. Each is first shown to be unparseable on a queue of its own.
func TestUnparseableMessages(t *testing.T) {
	h := newHarness(t, "unparseable", streamSize)
	conn := h.dialRaw()
	probe := h.queue + ".probe"
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(probe, false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	hostile := hostileMessages()
	for _, p := range hostile {
		h.publishRaw(conn, probe, p)
		h.expectUnparseable(probe, p.MessageId)
	}
	if _, err := ch.QueueDelete(probe, false, false, false); err != nil {
		t.Fatal(err)
	}

	h.stream()
	for k, p := range hostile {
		h.awaitSent(h.size * (k + 1) / (len(hostile) + 1))
		h.publishRaw(conn, h.queue, p)
		h.mu.Lock()
		h.hostile = append(h.hostile, p.MessageId)
		h.mu.Unlock()
		h.event("injected " + p.MessageId)
		h.mark()
	}
	h.finish()
}

// bigFramePayload is the size of the content header frame's payload of the big hostile
// message: above what amqp091-go's reader takes (frame_max 131,072 - 8), not above what
// RabbitMQ takes (frame_max).
const bigFramePayload = 131068

// hostileMessages are messages that amqp091-go refuses to read and RabbitMQ accepts: a
// header table nested 33 deep, 8,193 headers, an array of 8,193 elements, and a content
// header frame of bigFramePayload bytes.
func hostileMessages() []amqp.Publishing {
	nested := amqp.Table{}
	for range 32 {
		nested = amqp.Table{"n": nested}
	}
	many := amqp.Table{}
	for i := range 8193 {
		many[fmt.Sprintf("h%04d", i)] = int32(i)
	}
	array := make([]any, 8193)
	for i := range array {
		array[i] = int32(i)
	}
	const bigID = "hostile-big-frame"
	// The header frame's payload: class, weight, body size and flags (14 bytes), the
	// headers table (4-byte length; key "big": 1+3; type 'S': 1; 4-byte length; value),
	// the delivery mode (1) and the message id (1+len).
	big := bigFramePayload - (14 + 4 + 1 + 3 + 1 + 4 + 1 + 1 + len(bigID))
	msgs := []amqp.Publishing{
		{MessageId: "hostile-nested-33", Headers: amqp.Table{"nested": nested}},
		{MessageId: "hostile-8193-headers", Headers: many},
		{MessageId: "hostile-8193-array", Headers: amqp.Table{"array": array}},
		{MessageId: bigID, Headers: amqp.Table{"big": strings.Repeat("x", big)}},
	}
	for i := range msgs {
		msgs[i].DeliveryMode = amqp.Persistent
		msgs[i].Body = []byte("hostile")
	}
	return msgs
}

// expectUnparseable fetches the message at the head of queue with amqp091-go and fails the
// test unless its connection closes with a frame error, as a consumer's would.
func (h *harness) expectUnparseable(queue, id string) {
	conn := h.dialRaw()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	ch, err := conn.Channel()
	if err != nil {
		h.t.Fatal(err)
	}
	_, ok, err := ch.Get(queue, true)
	if err == nil {
		h.t.Fatalf("%s: amqp091-go read it (found: %t): it is not hostile", id, ok)
	}
	select {
	case cerr := <-closed:
		if cerr == nil || cerr.Code != amqp.FrameError {
			h.t.Fatalf("%s: connection closed with %v, not a frame error", id, cerr)
		}
		h.t.Logf("%s: the broker took it, amqp091-go refuses it: %v", id, cerr)
	case <-time.After(testenv.Patience()):
		h.t.Fatalf("%s: Get failed (%v) but the connection stays open", id, err)
	}
}
