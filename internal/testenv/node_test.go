//go:build faults

package testenv

import (
	"net"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
)

func TestNode(t *testing.T) {
	n := StartNode(t)
	if !strings.HasPrefix(n.URL(), "amqp://guest:guest@127.0.0.1:") || n.Addr() == "127.0.0.1:5672" {
		t.Fatalf("URL %s", n.URL())
	}

	conn := dial(t, n)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	publish(t, ch, q.Name, "hello", amqp.Transient)
	expectMessage(t, ch, q.Name, "hello")

	// Dropped connections.
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	n.CloseAllConnections()
	select {
	case err := <-closed:
		if err == nil {
			t.Fatal("connection closed without an error")
		}
		t.Logf("connection closed: %v", err)
	case <-time.After(Patience()):
		t.Fatal("connection not closed by CloseAllConnections")
	}

	// Restart: a durable queue and its persistent message survive.
	conn = dial(t, n)
	ch, err = conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	const durable = "warren.testenv.node.durable"
	if _, err := ch.QueueDeclare(durable, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirmed := ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	publish(t, ch, durable, "persistent", amqp.Persistent)
	if c := <-confirmed; !c.Ack {
		t.Fatal("publish not confirmed")
	}
	closed = conn.NotifyClose(make(chan *amqp.Error, 1))
	n.Restart()
	select {
	case err := <-closed:
		t.Logf("connection closed: %v", err)
	case <-time.After(Patience()):
		t.Fatal("connection survived Restart")
	}
	conn = dial(t, n)
	ch, err = conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if q, err := ch.QueueDeclarePassive(durable, true, false, false, false, nil); err != nil || q.Messages != 1 {
		t.Fatalf("durable queue after restart: %+v, %v", q, err)
	}
	expectMessage(t, ch, durable, "persistent")

	// Crash: every process of the node is killed with SIGKILL, and the node starts again on
	// the same port with its data: a confirmed persistent message survives.
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirmed = ch.NotifyPublish(make(chan amqp.Confirmation, 1))
	publish(t, ch, durable, "crash", amqp.Persistent)
	if c := <-confirmed; !c.Ack {
		t.Fatal("publish not confirmed")
	}
	closed = conn.NotifyClose(make(chan *amqp.Error, 1))
	before := n.processes()
	n.Crash()
	select {
	case err := <-closed:
		t.Logf("connection closed: %v", err)
	case <-time.After(Patience()):
		t.Fatal("connection survived Crash")
	}
	for _, pid := range before {
		if alive(pid) {
			t.Fatalf("process %d of the node survived Crash", pid)
		}
	}
	conn = dial(t, n)
	ch, err = conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	expectMessage(t, ch, durable, "crash")

	// Stop, twice: the port no longer answers.
	n.Stop()
	n.Stop()
	if c, err := net.DialTimeout("tcp", n.Addr(), time.Second); err == nil {
		_ = c.Close()
		t.Fatalf("%s still answers after Stop", n.Addr())
	}
	if out, err := n.Ctl("status"); err == nil {
		t.Fatalf("rabbitmqctl status works after Stop:\n%s", out)
	}
}

func dial(t *testing.T, n *Node) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(n.URL())
	if err != nil {
		t.Fatalf("dial %s: %v", n.URL(), err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func publish(t *testing.T, ch *amqp.Channel, queue, body string, mode uint8) {
	t.Helper()
	err := ch.Publish("", queue, true, false, amqp.Publishing{Body: []byte(body), DeliveryMode: mode})
	if err != nil {
		t.Fatalf("publish to %s: %v", queue, err)
	}
}

func expectMessage(t *testing.T, ch *amqp.Channel, queue, body string) {
	t.Helper()
	var (
		d      amqp.Delivery
		getErr error
	)
	require.Eventually(t, func() bool {
		var ok bool
		d, ok, getErr = ch.Get(queue, true)
		return ok || getErr != nil
	}, Patience(), 50*time.Millisecond, "no message in %s", queue)
	if getErr != nil {
		t.Fatalf("get from %s: %v", queue, getErr)
	}
	if string(d.Body) != body {
		t.Fatalf("got %q from %s, want %q", d.Body, queue, body)
	}
}
