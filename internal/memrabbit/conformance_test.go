package memrabbit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/memrabbit"
	"github.com/warrenmq/warren/internal/testenv"
)

// The conformance cases: each runs against the in-memory broker (in a synctest bubble, on
// its fake clock) and against the RabbitMQ of testenv.URL, and must see the same there.

// side is one broker a case runs against.
type side struct {
	t    *testing.T
	dial func() *amqp.Connection
	name func(string) string // a name of the case's own
}

// conformance runs c against both brokers.
func conformance(t *testing.T, c func(s side)) {
	t.Run("model", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := memrabbit.New()
			defer b.Close()
			c(side{t: t, name: func(n string) string { return n }, dial: func() *amqp.Connection {
				conn, err := amqp.DialConfig("amqp://guest:guest@memrabbit/", amqp.Config{
					Heartbeat: 0, Dial: func(string, string) (net.Conn, error) { return b.Dial() },
				})
				require.NoError(t, err)
				t.Cleanup(func() { _ = conn.Close() })
				return conn
			}})
		})
	})
	t.Run("rabbitmq", func(t *testing.T) {
		prefix := fmt.Sprintf("wt.%s.%d.", strings.ReplaceAll(t.Name(), "/", "."), time.Now().UnixNano())
		var admin *amqp.Connection
		var made []string
		c(side{t: t, name: func(n string) string { made = append(made, prefix+n); return prefix + n }, dial: func() *amqp.Connection {
			conn, err := amqp.Dial(testenv.URL())
			require.NoError(t, err, "the broker at %s must answer", testenv.URL())
			t.Cleanup(func() { _ = conn.Close() })
			if admin == nil {
				admin = conn
			}
			return conn
		}})
		if admin != nil { // the queues and exchanges the case named
			conn, err := amqp.Dial(testenv.URL())
			require.NoError(t, err)
			defer conn.Close()
			for _, n := range made {
				ch, err := conn.Channel()
				require.NoError(t, err)
				_, _ = ch.QueueDelete(n, false, false, false)
				_ = ch.ExchangeDelete(n, false, false)
				_ = ch.Close()
			}
		}
	})
}

// receive returns the next delivery, failing the case after a while.
func receive(s side, ds <-chan amqp.Delivery) amqp.Delivery {
	s.t.Helper()
	select {
	case d := <-ds:
		return d
	case <-time.After(5 * time.Second):
		s.t.Fatal("no delivery")
		return amqp.Delivery{}
	}
}

// none asserts that nothing is delivered for a while.
func none(s side, ds <-chan amqp.Delivery) {
	s.t.Helper()
	select {
	case d := <-ds:
		s.t.Fatalf("unexpected delivery %q", d.Body)
	case <-time.After(200 * time.Millisecond):
	}
}

func publish(s side, ch *amqp.Channel, exchange, key string, p amqp.Publishing) {
	s.t.Helper()
	require.NoError(s.t, ch.PublishWithContext(context.Background(), exchange, key, false, false, p))
}

func TestPublishAndConsumeThroughTheDefaultExchange(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(s.t, err)
		publish(s, ch, "", q, amqp.Publishing{Body: []byte("one"), MessageId: "m1", Headers: amqp.Table{"h": "v"}})
		publish(s, ch, "", q, amqp.Publishing{Body: []byte("two")})
		ds, err := ch.Consume(q, "", false, false, false, false, nil)
		require.NoError(s.t, err)
		d := receive(s, ds)
		assert.Equal(s.t, "one", string(d.Body))
		assert.Equal(s.t, "m1", d.MessageId)
		assert.Equal(s.t, amqp.Table{"h": "v"}, d.Headers)
		assert.Equal(s.t, q, d.RoutingKey)
		assert.False(s.t, d.Redelivered)
		assert.Equal(s.t, "two", string(receive(s, ds).Body))
		require.NoError(s.t, d.Ack(true))
	})
}

func TestAConfirmFollowsEveryPublish(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		require.NoError(s.t, ch.Confirm(false))
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(s.t, err)
		for i := range 3 {
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false, amqp.Publishing{Body: []byte{byte(i)}})
			require.NoError(s.t, err)
			assert.True(s.t, dc.Wait(), "acked")
			assert.Equal(s.t, uint64(i+1), dc.DeliveryTag)
		}
		// Unroutable is confirmed too.
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", s.name("nowhere"), false, false, amqp.Publishing{})
		require.NoError(s.t, err)
		assert.True(s.t, dc.Wait())
	})
}

func TestAMandatoryUnroutablePublishIsReturned(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		returns := ch.NotifyReturn(make(chan amqp.Return, 1))
		nowhere := s.name("nowhere")
		require.NoError(s.t, ch.PublishWithContext(context.Background(), "", nowhere, true, false, amqp.Publishing{Body: []byte("x")}))
		select {
		case r := <-returns:
			assert.Equal(s.t, uint16(312), r.ReplyCode)
			assert.Equal(s.t, "NO_ROUTE", r.ReplyText)
			assert.Equal(s.t, nowhere, r.RoutingKey)
			assert.Equal(s.t, "x", string(r.Body))
		case <-time.After(5 * time.Second):
			s.t.Fatal("no return")
		}
	})
}

func TestAPassiveDeclareOfAMissingQueueClosesTheChannelWith404(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		_, err = ch.QueueDeclarePassive(s.name("missing"), true, false, false, false, nil)
		var ae *amqp.Error
		require.True(s.t, errors.As(err, &ae), "%v", err)
		assert.Equal(s.t, 404, ae.Code)
		assert.False(s.t, ae.Server && !strings.HasPrefix(ae.Reason, "NOT_FOUND"), ae.Reason)
		assert.True(s.t, ch.IsClosed())
		assert.False(s.t, conn.IsClosed(), "a channel error leaves the connection open")
	})
}

func TestANackWithRequeueIsDeliveredAgainMarkedRedelivered(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(s.t, err)
		publish(s, ch, "", q, amqp.Publishing{Body: []byte("a")})
		ds, err := ch.Consume(q, "", false, false, false, false, nil)
		require.NoError(s.t, err)
		d := receive(s, ds)
		assert.False(s.t, d.Redelivered)
		require.NoError(s.t, d.Nack(false, true))
		d = receive(s, ds)
		assert.Equal(s.t, "a", string(d.Body))
		assert.True(s.t, d.Redelivered)
		require.NoError(s.t, d.Nack(false, false)) // dropped: no dead-letter exchange
		none(s, ds)
	})
}

func TestPrefetchBoundsWhatIsDeliveredUnacked(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(s.t, err)
		for i := range 5 {
			publish(s, ch, "", q, amqp.Publishing{Body: []byte{byte('0' + i)}})
		}
		require.NoError(s.t, ch.Qos(2, 0, false))
		ds, err := ch.Consume(q, "", false, false, false, false, nil)
		require.NoError(s.t, err)
		receive(s, ds)
		second := receive(s, ds)
		none(s, ds)
		require.NoError(s.t, second.Ack(true)) // both
		assert.Equal(s.t, "2", string(receive(s, ds).Body))
		assert.Equal(s.t, "3", string(receive(s, ds).Body))
		none(s, ds)
	})
}

func TestExchangesRouteByTheirType(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		kinds := map[string]string{"topic": s.name("topic"), "fanout": s.name("fanout"), "direct": s.name("direct"), "headers": s.name("headers")}
		for kind, x := range kinds {
			require.NoError(s.t, ch.ExchangeDeclare(x, kind, false, true, false, false, nil))
		}
		q := s.name("q")
		_, err = ch.QueueDeclare(q, false, false, false, false, nil)
		require.NoError(s.t, err)
		require.NoError(s.t, ch.QueueBind(q, "orders.*.paid", kinds["topic"], false, nil))
		require.NoError(s.t, ch.QueueBind(q, "audit.#", kinds["topic"], false, nil))
		require.NoError(s.t, ch.QueueBind(q, "ignored", kinds["fanout"], false, nil))
		require.NoError(s.t, ch.QueueBind(q, "k", kinds["direct"], false, nil))
		require.NoError(s.t, ch.QueueBind(q, "", kinds["headers"], false, amqp.Table{"x-match": "any", "a": "1", "b": "2"}))

		for _, p := range []struct{ x, key, body string }{
			{"topic", "orders.eu.paid", "t1"}, {"topic", "orders.eu.x.paid", "no"}, {"topic", "audit", "t2"},
			{"topic", "audit.a.b", "t3"}, {"fanout", "anything", "f1"}, {"direct", "k", "d1"}, {"direct", "K", "no"},
		} {
			publish(s, ch, kinds[p.x], p.key, amqp.Publishing{Body: []byte(p.body)})
		}
		publish(s, ch, kinds["headers"], "", amqp.Publishing{Body: []byte("h1"), Headers: amqp.Table{"b": "2"}})
		publish(s, ch, kinds["headers"], "", amqp.Publishing{Body: []byte("no"), Headers: amqp.Table{"c": "3"}})

		ds, err := ch.Consume(q, "", true, false, false, false, nil)
		require.NoError(s.t, err)
		var got []string
		for range 6 {
			got = append(got, string(receive(s, ds).Body))
		}
		assert.Equal(s.t, []string{"t1", "t2", "t3", "f1", "d1", "h1"}, got)
		none(s, ds)
	})
}

func TestAnExclusiveQueueIsLockedToItsConnection(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, false, false, true, false, nil)
		require.NoError(s.t, err)
		other, err := s.dial().Channel()
		require.NoError(s.t, err)
		_, err = other.Consume(q, "", false, false, false, false, nil)
		var ae *amqp.Error
		require.True(s.t, errors.As(err, &ae), "%v", err)
		assert.Equal(s.t, 405, ae.Code)
	})
}

func TestAnInequivalentRedeclareFailsWith406(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-max-length": int32(5)})
		require.NoError(s.t, err)
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-max-length": int64(5)})
		require.NoError(s.t, err, "the same argument in another integer width is equivalent")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-max-length": int64(6)})
		var ae *amqp.Error
		require.True(s.t, errors.As(err, &ae), "%v", err)
		assert.Equal(s.t, 406, ae.Code)
	})
}
