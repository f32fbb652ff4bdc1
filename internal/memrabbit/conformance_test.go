package memrabbit_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/memrabbit"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// The conformance cases: each runs against the in-memory broker (in a synctest bubble, on
// its fake clock) and against the RabbitMQ of testenv.URL, and must see the same there.

// side is one broker a case runs against.
type side struct {
	t    *testing.T
	dial func() *amqp.Connection
	// dialVia is dial through wrap's net.Conn: wrap is given the connection's socket.
	dialVia func(wrap func(net.Conn) net.Conn) *amqp.Connection
	name    func(string) string   // a name of the case's own
	conn    warren.Connection     // for warren's components
	delay   func() topology.Delay // a delay layout of the case's own, removed after it
}

// brokerVersion is the major.minor version of the broker of testenv.URL ("3.10", "4.0"),
// which the model follows in the cases; under -short, where no broker is asked, 3.10.
var brokerVersion = sync.OnceValues(func() (string, error) {
	if testing.Short() {
		return "3.10", nil
	}
	conn, err := amqp.Dial(testenv.URL())
	if err != nil {
		return "", err
	}
	defer conn.Close()
	v, _ := conn.Properties["version"].(string)
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return "", fmt.Errorf("the broker's version %q", v)
	}
	return parts[0] + "." + parts[1], nil
})

// conformance runs c against both brokers: the model as the version of the real one.
func conformance(t *testing.T, c func(s side)) {
	version, err := brokerVersion()
	require.NoError(t, err, "the broker at %s must answer", testenv.URL())
	t.Run("model", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			b := memrabbit.New(memrabbit.Config{Version: version})
			t.Cleanup(func() { _ = b.Close() }) // registered first: it runs after the case's own cleanups
			dialVia := func(wrap func(net.Conn) net.Conn) *amqp.Connection {
				conn, err := amqp.DialConfig("amqp://guest:guest@memrabbit/", amqp.Config{
					Heartbeat: 0, Dial: func(string, string) (net.Conn, error) {
						nc, err := b.Dial()
						if err != nil {
							return nil, err
						}
						return wrap(nc), nil
					},
				})
				require.NoError(t, err)
				t.Cleanup(func() { _ = conn.Close() })
				return conn
			}
			c(side{t: t, name: func(n string) string { return n }, conn: warren.Connection{URL: b.URL()},
				delay: func() topology.Delay { return topology.Delay{Levels: 4} }, dialVia: dialVia,
				dial: func() *amqp.Connection { return dialVia(func(nc net.Conn) net.Conn { return nc }) }})
		})
	})
	t.Run("rabbitmq", func(t *testing.T) {
		testenv.NeedsBroker(t)
		prefix := fmt.Sprintf("wt.%s.%d.", strings.ReplaceAll(t.Name(), "/", "."), time.Now().UnixNano())
		var made, madeX []string
		t.Cleanup(func() { // registered first: it runs after the case's own cleanups
			conn, err := amqp.Dial(testenv.URL())
			require.NoError(t, err)
			defer conn.Close()
			for _, n := range append(made, madeX...) {
				for _, extra := range []string{"", ".poison", ".kill", ".kill.state", ".kill.lock", ".kill.listeners"} {
					ch, err := conn.Channel()
					require.NoError(t, err)
					_, _ = ch.QueueDelete(n+extra, false, false, false)
					_ = ch.ExchangeDelete(n+extra, false, false)
					_ = ch.Close()
				}
			}
		})
		delay := func() topology.Delay {
			d := topology.Delay{Prefix: prefix + "delay", Levels: 4}
			qs, xs := d.WithDefaults().Names()
			made, madeX = append(made, append(qs, d.WithDefaults().LedgerQueue())...), append(madeX, xs...)
			return d
		}
		c(side{t: t, name: func(n string) string { made = append(made, prefix+n); return prefix + n }, delay: delay,
			conn: warren.Connection{URL: testenv.URL()}, dial: func() *amqp.Connection {
				conn, err := amqp.Dial(testenv.URL())
				require.NoError(t, err, "the broker at %s must answer", testenv.URL())
				t.Cleanup(func() { _ = conn.Close() })
				return conn
			}, dialVia: func(wrap func(net.Conn) net.Conn) *amqp.Connection {
				conn, err := amqp.DialConfig(testenv.URL(), amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
					nc, err := amqp.DefaultDial(30*time.Second)(network, addr)
					if err != nil {
						return nil, err
					}
					return wrap(nc), nil
				}})
				require.NoError(t, err, "the broker at %s must answer", testenv.URL())
				t.Cleanup(func() { _ = conn.Close() })
				return conn
			}})
	})
}

// receive returns the next delivery, failing the case after a while.
func receive(s side, ds <-chan amqp.Delivery) amqp.Delivery {
	s.t.Helper()
	d, _ := within(s, ds, "no delivery")
	return d
}

// within returns what c gives, and whether c was open, failing the case with what if c
// gives nothing in 5 s.
func within[T any](s side, c <-chan T, what string) (T, bool) {
	s.t.Helper()
	select {
	case v, ok := <-c:
		return v, ok
	case <-time.After(5 * time.Second):
		s.t.Fatal(what)
		var zero T
		return zero, false
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
		r, _ := within(s, returns, "no return")
		assert.Equal(s.t, uint16(312), r.ReplyCode)
		assert.Equal(s.t, "NO_ROUTE", r.ReplyText)
		assert.Equal(s.t, nowhere, r.RoutingKey)
		assert.Equal(s.t, "x", string(r.Body))
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

// deadLetterTo declares, on ch, an exchange and a queue bound to it with key "#"... a fanout
// exchange and its queue, where the case's dead letters go; it returns the exchange and the
// queue's deliveries.
func deadLetterTo(s side, ch *amqp.Channel) (string, <-chan amqp.Delivery) {
	s.t.Helper()
	dlx, dlq := s.name("dlx"), s.name("dlq")
	require.NoError(s.t, ch.ExchangeDeclare(dlx, "fanout", false, false, false, false, nil))
	_, err := ch.QueueDeclare(dlq, false, false, false, false, nil)
	require.NoError(s.t, err)
	require.NoError(s.t, ch.QueueBind(dlq, "", dlx, false, nil))
	ds, err := ch.Consume(dlq, "", true, false, false, false, nil)
	require.NoError(s.t, err)
	return dlx, ds
}

// death returns the first x-death entry of d, without its time.
func death(s side, d amqp.Delivery) amqp.Table {
	s.t.Helper()
	deaths, ok := d.Headers["x-death"].([]any)
	require.True(s.t, ok, "x-death: %#v", d.Headers["x-death"])
	require.NotEmpty(s.t, deaths)
	e, ok := deaths[0].(amqp.Table)
	require.True(s.t, ok)
	_, isTime := e["time"].(time.Time)
	assert.True(s.t, isTime, "time: %#v", e["time"])
	out := amqp.Table{}
	for k, v := range e {
		if k != "time" {
			out[k] = v
		}
	}
	return out
}

func TestAQueueTTLDeadLettersWithXDeath(t *testing.T) {
	for _, kind := range []string{"classic", "quorum"} {
		t.Run(kind, func(t *testing.T) {
			conformance(t, func(s side) {
				ch, err := s.dial().Channel()
				require.NoError(s.t, err)
				dlx, dead := deadLetterTo(s, ch)
				q := s.name("q")
				_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": kind,
					"x-message-ttl": int32(100), "x-dead-letter-exchange": dlx})
				require.NoError(s.t, err)
				start := time.Now()
				publish(s, ch, "", q, amqp.Publishing{Body: []byte("late"), Headers: amqp.Table{"mine": "kept"}})
				d := receive(s, dead)
				assert.GreaterOrEqual(s.t, time.Since(start), 100*time.Millisecond, "not before its TTL")
				assert.Equal(s.t, "late", string(d.Body))
				assert.Equal(s.t, q, d.RoutingKey, "the original routing key")
				assert.Equal(s.t, dlx, d.Exchange)
				assert.Equal(s.t, "kept", d.Headers["mine"])
				assert.Equal(s.t, amqp.Table{"count": int64(1), "reason": "expired", "queue": q, "exchange": "",
					"routing-keys": []any{q}}, death(s, d))
				assert.Equal(s.t, "expired", d.Headers["x-first-death-reason"])
				assert.Equal(s.t, q, d.Headers["x-first-death-queue"])
				assert.Equal(s.t, "", d.Headers["x-first-death-exchange"])
			})
		})
	}
}

func TestAPerMessageExpirationExpiresOnlyAtTheHead(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		dlx, dead := deadLetterTo(s, ch)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-dead-letter-exchange": dlx})
		require.NoError(s.t, err)
		publish(s, ch, "", q, amqp.Publishing{Body: []byte("slow"), Expiration: "400"})
		publish(s, ch, "", q, amqp.Publishing{Body: []byte("fast"), Expiration: "50"})
		first := receive(s, dead)
		assert.Equal(s.t, "slow", string(first.Body), "the later, shorter one waits behind the head")
		assert.Equal(s.t, "", first.Expiration, "the expiration goes")
		assert.Equal(s.t, "400", death(s, first)["original-expiration"])
		assert.Equal(s.t, "fast", string(receive(s, dead).Body))
	})
}

func TestARejectedMessageIsDeadLetteredWithItsRoutingKeyReplaced(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		dlx, dead := deadLetterTo(s, ch)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-dead-letter-exchange": dlx,
			"x-dead-letter-routing-key": "parked"})
		require.NoError(s.t, err)
		publish(s, ch, "", q, amqp.Publishing{Body: []byte("bad")})
		ds, err := ch.Consume(q, "", false, false, false, false, nil)
		require.NoError(s.t, err)
		require.NoError(s.t, receive(s, ds).Reject(false))
		d := receive(s, dead)
		assert.Equal(s.t, "parked", d.RoutingKey)
		assert.Equal(s.t, amqp.Table{"count": int64(1), "reason": "rejected", "queue": q, "exchange": "",
			"routing-keys": []any{q}}, death(s, d))
	})
}

func TestAQuorumQueueDeadLettersPastItsDeliveryLimit(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		dlx, dead := deadLetterTo(s, ch)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum",
			"x-delivery-limit": int64(2), "x-dead-letter-exchange": dlx})
		require.NoError(s.t, err)
		publish(s, ch, "", q, amqp.Publishing{Body: []byte("again")})
		ds, err := ch.Consume(q, "", false, false, false, false, nil)
		require.NoError(s.t, err)
		var counts []any
		for range 3 {
			d := receive(s, ds)
			counts = append(counts, d.Headers["x-delivery-count"])
			require.NoError(s.t, d.Nack(false, true))
		}
		assert.Equal(s.t, []any{nil, int64(1), int64(2)}, counts)
		d := receive(s, dead)
		assert.Equal(s.t, "delivery_limit", death(s, d)["reason"])
		none(s, ds)
	})
}

func TestExchangeToExchangeBindingsAndAlternateExchangesRoute(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		front, back, ae := s.name("front"), s.name("back"), s.name("ae")
		require.NoError(s.t, ch.ExchangeDeclare(ae, "fanout", false, false, false, false, nil))
		require.NoError(s.t, ch.ExchangeDeclare(front, "direct", false, false, false, false, amqp.Table{"alternate-exchange": ae}))
		require.NoError(s.t, ch.ExchangeDeclare(back, "topic", false, false, false, false, nil))
		require.NoError(s.t, ch.ExchangeBind(back, "k", front, false, nil))
		q, parked := s.name("q"), s.name("parked")
		for _, n := range []string{q, parked} {
			_, err = ch.QueueDeclare(n, false, false, false, false, nil)
			require.NoError(s.t, err)
		}
		require.NoError(s.t, ch.QueueBind(q, "#", back, false, nil))
		require.NoError(s.t, ch.QueueBind(parked, "", ae, false, nil))
		publish(s, ch, front, "k", amqp.Publishing{Body: []byte("through")})
		publish(s, ch, front, "other", amqp.Publishing{Body: []byte("aside")})
		ds, err := ch.Consume(q, "", true, false, false, false, nil)
		require.NoError(s.t, err)
		assert.Equal(s.t, "through", string(receive(s, ds).Body))
		ps, err := ch.Consume(parked, "", true, false, false, false, nil)
		require.NoError(s.t, err)
		assert.Equal(s.t, "aside", string(receive(s, ps).Body))
		none(s, ds)
	})
}

func TestMaxLengthDropsTheHeadOrRefusesThePublish(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		require.NoError(s.t, ch.Confirm(false))
		dlx, dead := deadLetterTo(s, ch)
		drop, refuse := s.name("drop"), s.name("refuse")
		_, err = ch.QueueDeclare(drop, true, false, false, false, amqp.Table{"x-max-length": int64(2), "x-dead-letter-exchange": dlx})
		require.NoError(s.t, err)
		_, err = ch.QueueDeclare(refuse, true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-max-length": int64(1),
			"x-overflow": "reject-publish"})
		require.NoError(s.t, err)
		for _, b := range []string{"1", "2", "3"} {
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", drop, false, false, amqp.Publishing{Body: []byte(b)})
			require.NoError(s.t, err)
			assert.True(s.t, dc.Wait())
		}
		d := receive(s, dead)
		assert.Equal(s.t, "1", string(d.Body))
		assert.Equal(s.t, "maxlen", death(s, d)["reason"])
		var acked []bool
		for _, b := range []string{"1", "2", "3"} {
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", refuse, false, false, amqp.Publishing{Body: []byte(b)})
			require.NoError(s.t, err)
			acked = append(acked, dc.Wait())
		}
		assert.Equal(s.t, []bool{true, true, false}, acked, "a quorum queue refuses only once it is over its limit")
	})
}

func TestASingleActiveConsumerGetsEverythingUntilItGoes(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		first, err := conn.Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = first.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-single-active-consumer": true})
		require.NoError(s.t, err)
		a, err := first.Consume(q, "a", false, false, false, false, nil)
		require.NoError(s.t, err)
		second, err := conn.Channel()
		require.NoError(s.t, err)
		bs, err := second.Consume(q, "b", false, false, false, false, nil)
		require.NoError(s.t, err)
		for _, b := range []string{"1", "2"} {
			publish(s, first, "", q, amqp.Publishing{Body: []byte(b)})
		}
		assert.Equal(s.t, "1", string(receive(s, a).Body))
		assert.Equal(s.t, "2", string(receive(s, a).Body))
		none(s, bs)
		require.NoError(s.t, first.Close()) // unacked: back to the queue, to b
		got := []string{string(receive(s, bs).Body), string(receive(s, bs).Body)}
		assert.Equal(s.t, []string{"1", "2"}, got)
	})
}

// amqpCode returns the code of err, an *amqp.Error, failing the case otherwise.
// refusedWith asserts that err is an AMQP error whose reason is reason.
func refusedWith(s side, err error, reason string, msgAndArgs ...any) {
	s.t.Helper()
	var ae *amqp.Error
	if assert.ErrorAs(s.t, err, &ae, msgAndArgs...) {
		assert.Equal(s.t, reason, ae.Reason, msgAndArgs...)
	}
}

func amqpCode(s side, err error) int {
	s.t.Helper()
	var ae *amqp.Error
	require.True(s.t, errors.As(err, &ae), "want an AMQP error, got %v", err)
	return ae.Code
}

func TestAnUnusedQueueExpires(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-expires": int32(1500)})
		require.NoError(s.t, err)
		publish(s, ch, "", q, amqp.Publishing{Body: []byte("held")}) // messages do not keep it
		_, err = ch.QueueDeclarePassive(q, true, false, false, false, amqp.Table{"x-expires": int32(1500)})
		require.NoError(s.t, err, "not yet")
		time.Sleep(2500 * time.Millisecond)
		_, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
		assert.Equal(s.t, 404, amqpCode(s, err), "gone")
	})
}

func TestAnAutoDeleteQueueGoesWithItsLastConsumer(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, false, true, false, false, nil)
		require.NoError(s.t, err)
		_, err = ch.Consume(q, "c1", true, false, false, false, nil)
		require.NoError(s.t, err)
		require.NoError(s.t, ch.Cancel("c1", false))
		other, err := conn.Channel()
		require.NoError(s.t, err)
		_, err = other.QueueDeclarePassive(q, false, true, false, false, nil)
		assert.Equal(s.t, 404, amqpCode(s, err))
	})
}

func TestGetTakesOneMessageAndCountsTheRest(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(s.t, err)
		_, ok, err := ch.Get(q, false)
		require.NoError(s.t, err)
		assert.False(s.t, ok, "empty")
		for _, b := range []string{"1", "2", "3"} {
			publish(s, ch, "", q, amqp.Publishing{Body: []byte(b)})
		}
		d, ok, err := ch.Get(q, false)
		require.NoError(s.t, err)
		require.True(s.t, ok)
		assert.Equal(s.t, "1", string(d.Body))
		assert.Equal(s.t, uint32(2), d.MessageCount)
		require.NoError(s.t, d.Nack(false, true))
		d, ok, err = ch.Get(q, true)
		require.NoError(s.t, err)
		require.True(s.t, ok)
		assert.Equal(s.t, "1", string(d.Body), "back at the head")
		assert.True(s.t, d.Redelivered)
		n, err := ch.QueuePurge(q, false)
		require.NoError(s.t, err)
		assert.Equal(s.t, 2, n)
	})
}

func TestMissingExchangesAndQueuesAre404(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		for _, op := range []func(*amqp.Channel) error{
			func(ch *amqp.Channel) error {
				return ch.ExchangeDeclarePassive(s.name("nox"), "direct", false, false, false, false, nil)
			},
			func(ch *amqp.Channel) error {
				return ch.PublishWithContext(context.Background(), s.name("nox"), "k", false, false, amqp.Publishing{})
			},
			func(ch *amqp.Channel) error { return ch.QueueBind(s.name("noq"), "k", "amq.direct", false, nil) },
			func(ch *amqp.Channel) error {
				_, err := ch.Consume(s.name("noq"), "", false, false, false, false, nil)
				return err
			},
		} {
			ch, err := conn.Channel()
			require.NoError(s.t, err)
			closed := ch.NotifyClose(make(chan *amqp.Error, 1))
			err = op(ch)
			if err == nil { // a publish is not answered: the channel's close says it
				select {
				case e := <-closed:
					err = e
				case <-time.After(5 * time.Second):
				}
			}
			assert.Equal(s.t, 404, amqpCode(s, err))
		}
	})
}

func TestUnbindingStopsTheRouting(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		x, q := s.name("x"), s.name("q")
		require.NoError(s.t, ch.ExchangeDeclare(x, "direct", false, false, false, false, nil))
		_, err = ch.QueueDeclare(q, false, false, false, false, nil)
		require.NoError(s.t, err)
		require.NoError(s.t, ch.QueueBind(q, "k", x, false, nil))
		publish(s, ch, x, "k", amqp.Publishing{Body: []byte("bound")})
		require.NoError(s.t, ch.QueueUnbind(q, "k", x, nil))
		publish(s, ch, x, "k", amqp.Publishing{Body: []byte("unbound")})
		ds, err := ch.Consume(q, "", true, false, false, false, nil)
		require.NoError(s.t, err)
		assert.Equal(s.t, "bound", string(receive(s, ds).Body))
		none(s, ds)
	})
}

func TestDeleteIfEmptyIsRefusedWith406OrByAQuorumQueueWith540(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		classic := s.name("classic")
		_, err = ch.QueueDeclare(classic, true, false, false, false, nil)
		require.NoError(s.t, err)
		publish(s, ch, "", classic, amqp.Publishing{})
		_, err = ch.QueueDelete(classic, false, true, false)
		assert.Equal(s.t, 406, amqpCode(s, err))

		conn := s.dial()
		ch, err = conn.Channel()
		require.NoError(s.t, err)
		quorum := s.name("quorum")
		_, err = ch.QueueDeclare(quorum, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		require.NoError(s.t, err)
		_, err = ch.QueueDelete(quorum, false, true, false)
		assert.Equal(s.t, 540, amqpCode(s, err))
		assert.True(s.t, conn.IsClosed(), "a connection error")
	})
}

func TestMultipleAcksAndNacks(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(s.t, err)
		for _, b := range []string{"1", "2", "3", "4"} {
			publish(s, ch, "", q, amqp.Publishing{Body: []byte(b)})
		}
		ds, err := ch.Consume(q, "", false, false, false, false, nil)
		require.NoError(s.t, err)
		var got []amqp.Delivery
		for range 4 {
			got = append(got, receive(s, ds))
		}
		require.NoError(s.t, got[1].Ack(true))        // 1 and 2
		require.NoError(s.t, got[3].Nack(true, true)) // 3 and 4, back in order
		again := []string{string(receive(s, ds).Body), string(receive(s, ds).Body)}
		assert.Equal(s.t, []string{"3", "4"}, again)
		none(s, ds)
	})
}

func TestAnAutomaticDeadLetterCycleIsDropped(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		a, b := s.name("a"), s.name("b")
		// a expires into b, b expires back into a: the second time into a is a cycle.
		_, err = ch.QueueDeclare(a, true, false, false, false, amqp.Table{"x-message-ttl": int32(50),
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": b})
		require.NoError(s.t, err)
		_, err = ch.QueueDeclare(b, true, false, false, false, amqp.Table{"x-message-ttl": int32(50),
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": a})
		require.NoError(s.t, err)
		publish(s, ch, "", a, amqp.Publishing{Body: []byte("round")})
		time.Sleep(time.Second)
		for _, q := range []string{a, b} {
			got, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			require.NoError(s.t, err)
			assert.Equal(s.t, 0, got.Messages, "%s: dropped", q)
		}
	})
}

func TestRejectPublishDLXRefusesAndDeadLetters(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		require.NoError(s.t, ch.Confirm(false))
		dlx, dead := deadLetterTo(s, ch)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-max-length": int64(1),
			"x-overflow": "reject-publish-dlx", "x-dead-letter-exchange": dlx})
		require.NoError(s.t, err)
		var acked []bool
		for _, b := range []string{"kept", "refused"} {
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false, amqp.Publishing{Body: []byte(b)})
			require.NoError(s.t, err)
			acked = append(acked, dc.Wait())
		}
		assert.Equal(s.t, []bool{true, false}, acked)
		d := receive(s, dead)
		assert.Equal(s.t, "refused", string(d.Body))
		assert.Equal(s.t, "maxlen", death(s, d)["reason"])
	})
}

func TestAStreamIsReadFromAnOffsetByEachConsumer(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		q := s.name("stream")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "stream"})
		require.NoError(s.t, err)
		require.NoError(s.t, ch.Confirm(false))
		for _, b := range []string{"1", "2", "3"} {
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false, amqp.Publishing{Body: []byte(b)})
			require.NoError(s.t, err)
			require.True(s.t, dc.Wait())
		}
		hourAgo := time.Now().Add(-time.Hour)
		for _, offset := range []any{"first", int64(1), "last", hourAgo, "10m"} {
			rc, err := conn.Channel()
			require.NoError(s.t, err)
			require.NoError(s.t, rc.Qos(10, 0, false))
			ds, err := rc.Consume(q, "", false, false, false, false, amqp.Table{"x-stream-offset": offset})
			require.NoError(s.t, err)
			d := receive(s, ds)
			want := map[any]string{"first": "1", int64(1): "2", "last": "3", hourAgo: "1", "10m": "1"}[offset]
			assert.Equal(s.t, want, string(d.Body), "offset %v", offset)
			assert.IsType(s.t, int64(0), d.Headers["x-stream-offset"])
			require.NoError(s.t, d.Ack(false))
			require.NoError(s.t, rc.Close())
		}
		nc, err := conn.Channel()
		require.NoError(s.t, err)
		_, err = nc.Consume(q, "", false, false, false, false, nil)
		assert.Equal(s.t, 406, amqpCode(s, err), "a stream is read with a prefetch")
	})
}

func TestAQuorumQueueWithoutADeliveryLimitHasTheVersionsDefault(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		require.NoError(s.t, err)
		publish(s, ch, "", q, amqp.Publishing{Body: []byte("again")})
		ds, err := ch.Consume(q, "", false, false, false, false, nil)
		require.NoError(s.t, err)
		for range 21 { // RabbitMQ 4.0 drops it after 20 returns; 3.10 has no limit
			require.NoError(s.t, receive(s, ds).Nack(false, true))
		}
		version, _ := brokerVersion()
		if strings.HasPrefix(version, "3.") {
			assert.Equal(s.t, int64(21), receive(s, ds).Headers["x-delivery-count"])
		} else {
			none(s, ds)
		}
	})
}

func TestTheVersionsDeathHeaders(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		dlx, dead := deadLetterTo(s, ch)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-dead-letter-exchange": dlx})
		require.NoError(s.t, err)
		publish(s, ch, "", q, amqp.Publishing{Body: []byte("x")})
		d, ok, err := ch.Get(q, false)
		require.NoError(s.t, err)
		require.True(s.t, ok)
		require.NoError(s.t, d.Reject(false))
		got := receive(s, dead)
		version, _ := brokerVersion()
		if strings.HasPrefix(version, "3.") {
			assert.NotContains(s.t, got.Headers, "x-last-death-reason")
		} else {
			assert.Equal(s.t, "rejected", got.Headers["x-last-death-reason"])
			assert.Equal(s.t, q, got.Headers["x-last-death-queue"])
		}
	})
}

func TestPropertiesTravelUnchanged(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(s.t, err)
		sent := amqp.Publishing{ContentType: "application/json", ContentEncoding: "gzip", DeliveryMode: amqp.Persistent,
			Priority: 3, CorrelationId: "c", ReplyTo: "r", MessageId: "m", Timestamp: time.Unix(1700000000, 0),
			Type: "t", UserId: "guest", AppId: "a", Body: []byte("b"),
			Headers: amqp.Table{"s": "x", "i": int32(7), "l": int64(8), "b": true, "f": 1.5, "t": amqp.Table{"n": "v"}, "a": []any{"x", int32(1)}}}
		publish(s, ch, "", q, sent)
		d, ok, err := ch.Get(q, true)
		require.NoError(s.t, err)
		require.True(s.t, ok)
		assert.Equal(s.t, []any{sent.ContentType, sent.ContentEncoding, sent.DeliveryMode, sent.Priority, sent.CorrelationId,
			sent.ReplyTo, sent.MessageId, sent.Timestamp.Unix(), sent.Type, sent.UserId, sent.AppId, string(sent.Body)},
			[]any{d.ContentType, d.ContentEncoding, d.DeliveryMode, d.Priority, d.CorrelationId, d.ReplyTo, d.MessageId,
				d.Timestamp.Unix(), d.Type, d.UserId, d.AppId, string(d.Body)})
		assert.Equal(s.t, sent.Headers, d.Headers)
	})
}

func TestConsumersOfAQueueShareItRoundRobin(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(s.t, err)
		a, err := ch.Consume(q, "a", true, false, false, false, nil)
		require.NoError(s.t, err)
		b, err := ch.Consume(q, "b", true, false, false, false, nil)
		require.NoError(s.t, err)
		for _, body := range []string{"1", "2", "3", "4"} {
			publish(s, ch, "", q, amqp.Publishing{Body: []byte(body)})
		}
		assert.Equal(s.t, []string{"1", "3"}, []string{string(receive(s, a).Body), string(receive(s, a).Body)})
		assert.Equal(s.t, []string{"2", "4"}, []string{string(receive(s, b).Body), string(receive(s, b).Body)})
	})
}

func TestAFanoutGivesEveryBoundQueueACopyAndAQueueOnePerMessage(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		x := s.name("x")
		require.NoError(s.t, ch.ExchangeDeclare(x, "direct", false, false, false, false, nil))
		var outs []<-chan amqp.Delivery
		for _, n := range []string{"q1", "q2"} {
			q := s.name(n)
			_, err = ch.QueueDeclare(q, false, false, false, false, nil)
			require.NoError(s.t, err)
			for _, key := range []string{"k", "k2"} { // bound twice: still one copy
				require.NoError(s.t, ch.QueueBind(q, key, x, false, nil))
			}
			require.NoError(s.t, ch.QueueBind(q, "k", x, false, nil)) // the same binding again: no second one
			ds, err := ch.Consume(q, "", true, false, false, false, nil)
			require.NoError(s.t, err)
			outs = append(outs, ds)
		}
		publish(s, ch, x, "k", amqp.Publishing{Body: []byte("once")})
		for _, ds := range outs {
			assert.Equal(s.t, "once", string(receive(s, ds).Body))
			none(s, ds)
		}
	})
}

func TestAnExclusiveQueueGoesWithItsConnection(t *testing.T) {
	conformance(t, func(s side) {
		owner := s.dial()
		ch, err := owner.Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, false, false, true, false, nil)
		require.NoError(s.t, err)
		require.NoError(s.t, owner.Close())
		other, err := s.dial().Channel()
		require.NoError(s.t, err)
		_, err = other.QueueDeclarePassive(q, false, false, true, false, nil)
		assert.Equal(s.t, 404, amqpCode(s, err))
	})
}

func TestAnExclusiveConsumerKeepsOthersOut(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(s.t, err)
		_, err = ch.Consume(q, "", false, true, false, false, nil)
		require.NoError(s.t, err)
		other, err := conn.Channel()
		require.NoError(s.t, err)
		_, err = other.Consume(q, "", false, false, false, false, nil)
		assert.Equal(s.t, 403, amqpCode(s, err))
	})
}

func TestWhatAClosedChannelHeldIsDeliveredAgainRedelivered(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(s.t, err)
		for _, body := range []string{"1", "2"} {
			publish(s, ch, "", q, amqp.Publishing{Body: []byte(body)})
		}
		first, err := conn.Channel()
		require.NoError(s.t, err)
		ds, err := first.Consume(q, "", false, false, false, false, nil)
		require.NoError(s.t, err)
		receive(s, ds)
		receive(s, ds)
		require.NoError(s.t, first.Close())
		second, err := conn.Channel()
		require.NoError(s.t, err)
		ds, err = second.Consume(q, "", false, false, false, false, nil)
		require.NoError(s.t, err)
		for _, want := range []string{"1", "2"} {
			d := receive(s, ds)
			assert.Equal(s.t, want, string(d.Body))
			assert.True(s.t, d.Redelivered)
		}
	})
}

func TestADeadLetterExchangeThatDoesNotExistDropsTheMessage(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-dead-letter-exchange": s.name("absent"),
			"x-message-ttl": int32(10)})
		require.NoError(s.t, err)
		publish(s, ch, "", q, amqp.Publishing{Body: []byte("gone")})
		time.Sleep(time.Second) // room for a busy broker
		got, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
		require.NoError(s.t, err)
		assert.Equal(s.t, 0, got.Messages)
	})
}

func TestTopicPatterns(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		x := s.name("x")
		require.NoError(s.t, ch.ExchangeDeclare(x, "topic", false, false, false, false, nil))
		queues := map[string]string{}
		for _, pattern := range []string{"#", "*", "a.#.b", "a.*", "#.z"} {
			q := s.name("q" + strings.NewReplacer("#", "H", "*", "S", ".", "_").Replace(pattern))
			queues[pattern] = q
			_, err = ch.QueueDeclare(q, false, false, false, false, nil)
			require.NoError(s.t, err)
			require.NoError(s.t, ch.QueueBind(q, pattern, x, false, nil))
		}
		for _, key := range []string{"", "a", "a.b", "a.x.y.b", "z", "y.z", "a.b.c"} {
			publish(s, ch, x, key, amqp.Publishing{Body: []byte(key)})
		}
		want := map[string][]string{
			"#": {"", "a", "a.b", "a.x.y.b", "z", "y.z", "a.b.c"}, "*": {"a", "z"}, "a.#.b": {"a.b", "a.x.y.b"},
			"a.*": {"a.b"}, "#.z": {"z", "y.z"},
		}
		for pattern, q := range queues {
			assert.Equal(s.t, want[pattern], getAll(s, ch, q), "pattern %q", pattern)
		}
	})
}

func TestHeadersExchangeMatchesAllOrAnyAndIgnoresXArguments(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		x := s.name("x")
		require.NoError(s.t, ch.ExchangeDeclare(x, "headers", false, false, false, false, nil))
		all, anyq := s.name("all"), s.name("any")
		for _, q := range []string{all, anyq} {
			_, err = ch.QueueDeclare(q, false, false, false, false, nil)
			require.NoError(s.t, err)
		}
		require.NoError(s.t, ch.QueueBind(all, "", x, false, amqp.Table{"x-match": "all", "a": "1", "n": int32(2), "x-ignored": "y"}))
		require.NoError(s.t, ch.QueueBind(anyq, "", x, false, amqp.Table{"x-match": "any", "a": "1", "b": "2"}))
		for body, h := range map[string]amqp.Table{
			"both": {"a": "1", "n": int32(2)}, "one": {"a": "1"}, "wrong": {"a": "2", "b": "3"}, "b": {"b": "2"},
		} {
			publish(s, ch, x, "", amqp.Publishing{Body: []byte(body), Headers: h})
		}
		get := func(q string) []string {
			got := getAll(s, ch, q)
			slices.Sort(got)
			return got
		}
		assert.Equal(s.t, []string{"both"}, get(all))
		assert.Equal(s.t, []string{"b", "both", "one"}, get(anyq))
	})
}

func TestReservedNamesAreRefused(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		_, err = ch.QueueDeclare("amq."+s.name("q"), false, false, false, false, nil)
		assert.Equal(s.t, 403, amqpCode(s, err))
		ch, err = conn.Channel()
		require.NoError(s.t, err)
		err = ch.ExchangeDeclare("amq."+s.name("x"), "direct", false, false, false, false, nil)
		assert.Equal(s.t, 403, amqpCode(s, err))
		ch, err = conn.Channel()
		require.NoError(s.t, err)
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		require.NoError(s.t, err)
		assert.True(s.t, strings.HasPrefix(q.Name, "amq.gen-"), q.Name)
	})
}

func TestDeleteIfUnusedRefusesWhatIsInUse(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		x, q := s.name("x"), s.name("q")
		require.NoError(s.t, ch.ExchangeDeclare(x, "fanout", false, false, false, false, nil))
		_, err = ch.QueueDeclare(q, false, false, false, false, nil)
		require.NoError(s.t, err)
		require.NoError(s.t, ch.QueueBind(q, "", x, false, nil))
		_, err = ch.Consume(q, "", false, false, false, false, nil)
		require.NoError(s.t, err)
		other, err := conn.Channel()
		require.NoError(s.t, err)
		assert.Equal(s.t, 406, amqpCode(s, other.ExchangeDelete(x, true, false)))
		other, err = conn.Channel()
		require.NoError(s.t, err)
		_, err = other.QueueDelete(q, true, false, false)
		assert.Equal(s.t, 406, amqpCode(s, err))
	})
}

func TestPrefetchIsPerConsumerUnlessGlobal(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		a, b := s.name("a"), s.name("b")
		for _, q := range []string{a, b} {
			_, err = ch.QueueDeclare(q, false, false, false, false, nil)
			require.NoError(s.t, err)
			for _, body := range []string{"1", "2"} {
				publish(s, ch, "", q, amqp.Publishing{Body: []byte(q + body)})
			}
		}
		require.NoError(s.t, ch.Qos(1, 0, false))
		as, err := ch.Consume(a, "", false, false, false, false, nil)
		require.NoError(s.t, err)
		bs, err := ch.Consume(b, "", false, false, false, false, nil)
		require.NoError(s.t, err)
		receive(s, as) // one each: the limit is each consumer's
		receive(s, bs)
		none(s, as)
		none(s, bs)

		g, err := conn.Channel()
		require.NoError(s.t, err)
		require.NoError(s.t, g.Qos(1, 0, true)) // the channel's, shared
		c, d := s.name("c"), s.name("d")
		for _, q := range []string{c, d} {
			_, err = g.QueueDeclare(q, false, false, false, false, nil)
			require.NoError(s.t, err)
			publish(s, g, "", q, amqp.Publishing{Body: []byte(q)})
		}
		cs, err := g.Consume(c, "", false, false, false, false, nil)
		require.NoError(s.t, err)
		ds, err := g.Consume(d, "", false, false, false, false, nil)
		require.NoError(s.t, err)
		first := receive(s, cs)
		none(s, ds)
		require.NoError(s.t, first.Ack(false))
		receive(s, ds)
	})
}

func TestTheShorterOfTheQueueTTLAndTheMessagesExpirationWins(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		dlx, dead := deadLetterTo(s, ch)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-message-ttl": int32(60000),
			"x-dead-letter-exchange": dlx})
		require.NoError(s.t, err)
		start := time.Now()
		publish(s, ch, "", q, amqp.Publishing{Body: []byte("short"), Expiration: "100"})
		d := receive(s, dead)
		assert.Less(s.t, time.Since(start), 30*time.Second, "by its own expiration, not the queue's minute")
		assert.GreaterOrEqual(s.t, time.Since(start), 100*time.Millisecond)
		assert.Equal(s.t, "expired", death(s, d)["reason"])
		assert.Equal(s.t, "100", death(s, d)["original-expiration"])
	})
}

func TestAnAlternateExchangeTakesWhatWouldBeReturned(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		returns := ch.NotifyReturn(make(chan amqp.Return, 2))
		plain, covered, ae := s.name("plain"), s.name("covered"), s.name("ae")
		require.NoError(s.t, ch.ExchangeDeclare(plain, "direct", false, false, false, false, nil))
		require.NoError(s.t, ch.ExchangeDeclare(ae, "fanout", false, false, false, false, nil))
		require.NoError(s.t, ch.ExchangeDeclare(covered, "direct", false, false, false, false, amqp.Table{"alternate-exchange": ae}))
		q := s.name("q")
		_, err = ch.QueueDeclare(q, false, false, false, false, nil)
		require.NoError(s.t, err)
		require.NoError(s.t, ch.QueueBind(q, "", ae, false, nil))
		require.NoError(s.t, ch.PublishWithContext(context.Background(), covered, "k", true, false, amqp.Publishing{Body: []byte("caught")}))
		require.NoError(s.t, ch.PublishWithContext(context.Background(), plain, "k", true, false, amqp.Publishing{Body: []byte("back")}))
		r, _ := within(s, returns, "no return")
		assert.Equal(s.t, "back", string(r.Body))
		d, ok, err := ch.Get(q, true)
		require.NoError(s.t, err)
		require.True(s.t, ok)
		assert.Equal(s.t, "caught", string(d.Body))
	})
}

func TestXDeathCountsTheSameDeathAgainAndKeepsTheNewestFirst(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		waiting, working := s.name("waiting"), s.name("working")
		// waiting expires into working; working's rejects go back to waiting.
		_, err = ch.QueueDeclare(waiting, true, false, false, false, amqp.Table{"x-message-ttl": int32(20),
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": working})
		require.NoError(s.t, err)
		_, err = ch.QueueDeclare(working, true, false, false, false, amqp.Table{
			"x-dead-letter-exchange": "", "x-dead-letter-routing-key": waiting})
		require.NoError(s.t, err)
		publish(s, ch, "", waiting, amqp.Publishing{Body: []byte("loop")})
		ds, err := ch.Consume(working, "", false, false, false, false, nil)
		require.NoError(s.t, err)
		require.NoError(s.t, receive(s, ds).Reject(false))
		d := receive(s, ds) // expired from waiting a second time
		deaths, ok := d.Headers["x-death"].([]any)
		require.True(s.t, ok)
		require.Len(s.t, deaths, 2)
		first, second := deaths[0].(amqp.Table), deaths[1].(amqp.Table)
		assert.Equal(s.t, []any{waiting, "expired", int64(2)}, []any{first["queue"], first["reason"], first["count"]})
		assert.Equal(s.t, []any{working, "rejected", int64(1)}, []any{second["queue"], second["reason"], second["count"]})
		assert.Equal(s.t, "expired", d.Headers["x-first-death-reason"])
		assert.Equal(s.t, waiting, d.Headers["x-first-death-queue"])
	})
}

func TestAClassicQueueRefusesAtItsLimit(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		require.NoError(s.t, ch.Confirm(false))
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-max-length": int64(2), "x-overflow": "reject-publish"})
		require.NoError(s.t, err)
		var acked []bool
		for _, b := range []string{"1", "2", "3"} {
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false, amqp.Publishing{Body: []byte(b)})
			require.NoError(s.t, err)
			acked = append(acked, dc.Wait())
		}
		assert.Equal(s.t, []bool{true, true, false}, acked)
		// What a consumer holds does not count.
		d, ok, err := ch.Get(q, false)
		require.NoError(s.t, err)
		require.True(s.t, ok)
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false, amqp.Publishing{Body: []byte("4")})
		require.NoError(s.t, err)
		assert.True(s.t, dc.Wait())
		require.NoError(s.t, d.Ack(false))
	})
}

func TestTheNextSingleActiveConsumerTakesOverOnCancel(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum", "x-single-active-consumer": true})
		require.NoError(s.t, err)
		a, err := ch.Consume(q, "a", true, false, false, false, nil)
		require.NoError(s.t, err)
		b, err := ch.Consume(q, "b", true, false, false, false, nil)
		require.NoError(s.t, err)
		publish(s, ch, "", q, amqp.Publishing{Body: []byte("1")})
		assert.Equal(s.t, "1", string(receive(s, a).Body))
		require.NoError(s.t, ch.Cancel("a", false))
		publish(s, ch, "", q, amqp.Publishing{Body: []byte("2")})
		assert.Equal(s.t, "2", string(receive(s, b).Body))
	})
}

func TestANackOfManyWithoutRequeueDeadLettersEach(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		dlx, dead := deadLetterTo(s, ch)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-dead-letter-exchange": dlx})
		require.NoError(s.t, err)
		for _, b := range []string{"1", "2", "3"} {
			publish(s, ch, "", q, amqp.Publishing{Body: []byte(b)})
		}
		ds, err := ch.Consume(q, "", false, false, false, false, nil)
		require.NoError(s.t, err)
		var last amqp.Delivery
		for range 3 {
			last = receive(s, ds)
		}
		require.NoError(s.t, last.Nack(true, false))
		var got []string
		for range 3 {
			got = append(got, string(receive(s, dead).Body))
		}
		assert.Equal(s.t, []string{"1", "2", "3"}, got)
	})
}

func TestPublishingToAnInternalExchangeIsRefused(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		x := s.name("x")
		require.NoError(s.t, ch.ExchangeDeclare(x, "fanout", false, false, true, false, nil))
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		require.NoError(s.t, ch.PublishWithContext(context.Background(), x, "", false, false, amqp.Publishing{}))
		e, _ := within(s, closed, "not refused")
		assert.Equal(s.t, 403, e.Code)
	})
}

func TestAReturnComesBeforeItsConfirm(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		require.NoError(s.t, ch.Confirm(false))
		// Unbuffered: the client hands them over in the order they came, each waiting for
		// the case to take it.
		returns := ch.NotifyReturn(make(chan amqp.Return))
		confirms := ch.NotifyPublish(make(chan amqp.Confirmation))
		require.NoError(s.t, ch.PublishWithContext(context.Background(), "", s.name("nowhere"), true, false, amqp.Publishing{}))
		select {
		case <-returns:
		case <-confirms:
			s.t.Fatal("the confirm came first")
		case <-time.After(5 * time.Second):
			s.t.Fatal("neither")
		}
		c := <-confirms
		assert.True(s.t, c.Ack)
	})
}

func TestAnExchangeBindingCycleDeliversOnce(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		x1, x2, q := s.name("x1"), s.name("x2"), s.name("q")
		for _, x := range []string{x1, x2} {
			require.NoError(s.t, ch.ExchangeDeclare(x, "fanout", false, false, false, false, nil))
		}
		require.NoError(s.t, ch.ExchangeBind(x2, "", x1, false, nil))
		require.NoError(s.t, ch.ExchangeBind(x1, "", x2, false, nil))
		_, err = ch.QueueDeclare(q, false, false, false, false, nil)
		require.NoError(s.t, err)
		require.NoError(s.t, ch.QueueBind(q, "", x1, false, nil))
		require.NoError(s.t, ch.QueueBind(q, "", x2, false, nil))
		publish(s, ch, x1, "", amqp.Publishing{Body: []byte("once")})
		ds, err := ch.Consume(q, "", true, false, false, false, nil)
		require.NoError(s.t, err)
		assert.Equal(s.t, "once", string(receive(s, ds).Body))
		none(s, ds)
	})
}

func TestADeclareCountsTheReadyMessagesAndTheConsumers(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(s.t, err)
		for _, b := range []string{"1", "2", "3"} {
			publish(s, ch, "", q, amqp.Publishing{Body: []byte(b)})
		}
		require.NoError(s.t, ch.Qos(1, 0, false))
		ds, err := ch.Consume(q, "", false, false, false, false, nil)
		require.NoError(s.t, err)
		receive(s, ds) // one out, unacked
		other, err := s.dial().Channel()
		require.NoError(s.t, err)
		got, err := other.QueueDeclarePassive(q, true, false, false, false, nil)
		require.NoError(s.t, err)
		assert.Equal(s.t, []int{2, 1}, []int{got.Messages, got.Consumers})
	})
}

func TestANoAckConsumerIsNotBoundByThePrefetch(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(s.t, err)
		for _, b := range []string{"1", "2", "3"} {
			publish(s, ch, "", q, amqp.Publishing{Body: []byte(b)})
		}
		require.NoError(s.t, ch.Qos(1, 0, false))
		ds, err := ch.Consume(q, "", true, false, false, false, nil)
		require.NoError(s.t, err)
		for _, want := range []string{"1", "2", "3"} {
			assert.Equal(s.t, want, string(receive(s, ds).Body))
		}
	})
}

// getAll takes every message of queue q (basic.get, acked), and returns their bodies in order.
func getAll(s side, ch *amqp.Channel, q string) []string {
	s.t.Helper()
	var got []string
	for {
		d, ok, err := ch.Get(q, true)
		require.NoError(s.t, err)
		if !ok {
			return got
		}
		got = append(got, string(d.Body))
	}
}

func TestAConsumerCancelledByItsQueuesDeletionEndsItsDeliveries(t *testing.T) {
	conformance(t, func(s side) {
		for _, kind := range []string{"classic", "quorum"} {
			conn := s.dial()
			ch, err := conn.Channel()
			require.NoError(s.t, err)
			closed := ch.NotifyClose(make(chan *amqp.Error, 1))
			q := s.name(kind)
			_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": kind})
			require.NoError(s.t, err)
			for _, b := range []string{"1", "2"} {
				publish(s, ch, "", q, amqp.Publishing{Body: []byte(b)})
			}
			require.NoError(s.t, ch.Qos(1, 0, false))
			cancels := ch.NotifyCancel(make(chan string, 1))
			ds, err := ch.Consume(q, "mine", false, false, false, false, nil)
			require.NoError(s.t, err)
			d := receive(s, ds)
			other, err := conn.Channel()
			require.NoError(s.t, err)
			n, err := other.QueueDelete(q, false, false, false)
			require.NoError(s.t, err)
			assert.Equal(s.t, 1, n, "the unacked message is not counted")
			tag, _ := within(s, cancels, "no cancel")
			assert.Equal(s.t, "mine", tag)
			extra, ok := within(s, ds, "the deliveries did not end")
			assert.False(s.t, ok, "the deliveries end, got %q", extra.Body)
			// The channel stays open: it takes the settlement of what it received, and a cancel of
			// the tag the broker cancelled.
			require.NoError(s.t, d.Ack(false))
			require.NoError(s.t, ch.Cancel("mine", false))
			_, err = ch.QueueDeclarePassive(q, true, false, false, false, nil)
			assert.Equal(s.t, 404, amqpCode(s, err))
			e, _ := within(s, closed, "the passive declare did not close the channel")
			assert.Equal(s.t, 404, e.Code, "closed by the passive declare only")
		}
	})
}

func TestAQueueDeletedAndDeclaredAgainIsANewQueue(t *testing.T) {
	conformance(t, func(s side) {
		for _, kind := range []string{"classic", "quorum"} {
			conn := s.dial()
			ch, err := conn.Channel()
			require.NoError(s.t, err)
			q := s.name(kind)
			args := amqp.Table{"x-queue-type": kind}
			_, err = ch.QueueDeclare(q, true, false, false, false, args)
			require.NoError(s.t, err)
			require.NoError(s.t, ch.Confirm(false))
			for _, b := range []string{"got", "consumed"} {
				confirmed(s, ch, q, b)
			}
			got, ok, err := ch.Get(q, false)
			require.NoError(s.t, err)
			require.True(s.t, ok)
			cancels := ch.NotifyCancel(make(chan string, 1))
			ds, err := ch.Consume(q, "mine", false, false, false, false, nil)
			require.NoError(s.t, err)
			consumed := receive(s, ds)
			other, err := conn.Channel()
			require.NoError(s.t, err)
			_, err = other.QueueDelete(q, false, false, false)
			require.NoError(s.t, err)
			within(s, cancels, "no cancel")
			_, err = other.QueueDeclare(q, true, false, false, false, args)
			require.NoError(s.t, err)
			// What the old queue delivered goes back to it, not to the new one: it is gone.
			require.NoError(s.t, got.Nack(false, true))
			require.NoError(s.t, consumed.Reject(true))
			publish(s, other, "", q, amqp.Publishing{Body: []byte("new")})
			ds, err = ch.Consume(q, "mine", false, false, false, false, nil)
			require.NoError(s.t, err, "the tag is free again")
			d := receive(s, ds)
			assert.Equal(s.t, "new", string(d.Body))
			assert.False(s.t, d.Redelivered)
			require.NoError(s.t, d.Ack(false))
			none(s, ds)
			info, err := other.QueueDeclarePassive(q, true, false, false, false, args)
			require.NoError(s.t, err)
			assert.Equal(s.t, 1, info.Consumers)
		}
	})
}

// confirmed publishes body to queue q on ch, in confirm mode, and waits for the broker's ack:
// a quorum queue holds it then.
func confirmed(s side, ch *amqp.Channel, q, body string) {
	s.t.Helper()
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false, amqp.Publishing{Body: []byte(body)})
	require.NoError(s.t, err)
	require.True(s.t, dc.Wait(), "acked")
}

func TestAQuorumQueueRefusesWhatOnlyAClassicQueueHas(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		for _, c := range []struct {
			name                           string
			durable, autoDelete, exclusive bool
			args                           amqp.Table
			refused                        string
		}{
			{"prio", true, false, false, amqp.Table{"x-max-priority": int32(5)}, "invalid arg 'x-max-priority'"},
			{"lazy", true, false, false, amqp.Table{"x-queue-mode": "lazy"}, "invalid arg 'x-queue-mode'"},
			{"locator", true, false, false, amqp.Table{"x-queue-master-locator": "min-masters"}, "invalid arg 'x-queue-master-locator'"},
			{"version", true, false, false, amqp.Table{"x-queue-version": int32(2)}, "invalid arg 'x-queue-version'"},
			{"transient", false, false, false, nil, "invalid property 'non-durable'"},
			{"autodelete", true, true, false, nil, "invalid property 'auto-delete'"},
			{"exclusive", true, false, true, nil, "invalid property 'exclusive-owner'"},
		} {
			ch, err := conn.Channel()
			require.NoError(s.t, err)
			q := s.name(c.name)
			args := amqp.Table{"x-queue-type": "quorum"}
			maps.Copy(args, c.args)
			_, err = ch.QueueDeclare(q, c.durable, c.autoDelete, c.exclusive, false, args)
			want := fmt.Sprintf("PRECONDITION_FAILED - %s for queue '%s' in vhost '/'", c.refused, q)
			if strings.HasPrefix(c.refused, "invalid arg") {
				want += " of queue type rabbit_quorum_queue"
			}
			var ae *amqp.Error
			require.True(s.t, errors.As(err, &ae), "%s: want an AMQP error, got %v", c.name, err)
			assert.Equal(s.t, 406, ae.Code, c.name)
			assert.Equal(s.t, want, ae.Reason, c.name)
			ch, err = conn.Channel()
			require.NoError(s.t, err)
			_, err = ch.QueueDeclarePassive(q, c.durable, c.autoDelete, c.exclusive, false, args)
			assert.Equal(s.t, 404, amqpCode(s, err), "%s: not declared", c.name)
		}
	})
}

func TestAPriorityQueueDeliversTheHighestPriorityFirst(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		require.NoError(s.t, ch.Confirm(false))
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-max-priority": int32(5)})
		require.NoError(s.t, err)
		// Without a priority: 0; above the queue's maximum: the maximum.
		for _, m := range []struct {
			body     string
			priority uint8
		}{{"a1", 1}, {"b3", 3}, {"c1", 1}, {"d0", 0}, {"e9", 9}, {"f3", 3}, {"g5", 5}} {
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false,
				amqp.Publishing{Body: []byte(m.body), Priority: m.priority})
			require.NoError(s.t, err)
			require.True(s.t, dc.Wait())
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false, amqp.Publishing{Body: []byte("none")})
		require.NoError(s.t, err)
		require.True(s.t, dc.Wait())
		// A message that comes back goes back among those of its priority, at their head.
		var got []string
		for range 3 {
			d, ok, err := ch.Get(q, false)
			require.NoError(s.t, err)
			require.True(s.t, ok)
			got = append(got, string(d.Body))
		}
		assert.Equal(s.t, []string{"e9", "g5", "b3"}, got)
		require.NoError(s.t, ch.Nack(0, true, true))
		assert.Equal(s.t, []string{"e9", "g5", "b3", "f3", "a1", "c1", "d0", "none"}, getAll(s, ch, q))
	})
}

func TestMaxLengthBytesCountsTheBodiesOfTheReadyMessages(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		require.NoError(s.t, ch.Confirm(false))
		dlx, dead := deadLetterTo(s, ch)
		publishAll := func(q string, bodies ...string) []bool {
			var acked []bool
			for _, b := range bodies {
				dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false,
					amqp.Publishing{Body: []byte(b), Headers: amqp.Table{"h": "not counted"}})
				require.NoError(s.t, err)
				acked = append(acked, dc.Wait())
			}
			return acked
		}
		// drop-head: the oldest go until the bodies fit.
		drop := s.name("drop")
		_, err = ch.QueueDeclare(drop, true, false, false, false, amqp.Table{"x-max-length-bytes": int64(10), "x-dead-letter-exchange": dlx})
		require.NoError(s.t, err)
		assert.Equal(s.t, []bool{true, true, true, true}, publishAll(drop, "aaaa", "bbbb", "cc", "dddddddd"))
		for _, want := range []string{"aaaa", "bbbb"} {
			d := receive(s, dead)
			assert.Equal(s.t, want, string(d.Body))
			assert.Equal(s.t, "maxlen", death(s, d)["reason"])
		}
		assert.Equal(s.t, []string{"cc", "dddddddd"}, getAll(s, ch, drop))
		// reject-publish: a classic queue refuses what would take it over its limit; a quorum
		// queue takes messages until it is over it.
		for _, c := range []struct {
			kind  string
			acked []bool
		}{
			{"classic", []bool{true, true, false, true, false}},
			{"quorum", []bool{true, true, true, false, false}},
		} {
			q := s.name(c.kind)
			_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": c.kind, "x-max-length-bytes": int64(10),
				"x-overflow": "reject-publish"})
			require.NoError(s.t, err)
			assert.Equal(s.t, c.acked, publishAll(q, "aaaa", "bbbb", "ccccc", "dd", "e"), c.kind)
		}
	})
}

func TestWhereAQuorumQueuesGetReturnsAMessageIsTheVersions(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		require.NoError(s.t, ch.Confirm(false))
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		require.NoError(s.t, err)
		for _, b := range []string{"1", "2", "3"} {
			confirmed(s, ch, q, b)
		}
		seen := func(d amqp.Delivery) string {
			return fmt.Sprintf("%s %t %T(%[3]v)", d.Body, d.Redelivered, d.Headers["x-delivery-count"])
		}
		var got []string
		for _, back := range []func(amqp.Delivery) error{
			func(d amqp.Delivery) error { return d.Nack(false, true) },
			func(d amqp.Delivery) error { return d.Reject(true) },
		} {
			d, ok, err := ch.Get(q, false)
			require.NoError(s.t, err)
			require.True(s.t, ok)
			got = append(got, seen(d))
			require.NoError(s.t, back(d))
		}
		for range 3 {
			d, ok, err := ch.Get(q, true)
			require.NoError(s.t, err)
			require.True(s.t, ok)
			got = append(got, seen(d))
		}
		version, _ := brokerVersion()
		if strings.HasPrefix(version, "3.") { // to the tail; every basic.get tells the count
			assert.Equal(s.t, []string{"1 false int64(0)", "2 false int64(0)", "3 false int64(0)", "1 true int64(1)", "2 true int64(1)"}, got)
		} else { // to the head, as a consumer's
			assert.Equal(s.t, []string{"1 false <nil>(<nil>)", "1 true int64(1)", "1 true int64(2)", "2 false <nil>(<nil>)",
				"3 false <nil>(<nil>)"}, got)
		}
	})
}

// A connection its client closes is ended by the client: after its close-ok the broker leaves
// the socket open (RabbitMQ for up to 30 s), so the client's reader does not see the end of
// the stream before the client closes it (amqp091 would tell that end to NotifyClose as a
// lost connection when it reads it first).
func TestAConnectionItsClientClosesIsEndedByTheClient(t *testing.T) {
	conformance(t, func(s side) {
		w := &endWatch{}
		conn := s.dialVia(func(nc net.Conn) net.Conn { w.Conn = nc; return w })
		closed := conn.NotifyClose(make(chan *amqp.Error, 1))
		require.NoError(s.t, conn.Close())
		err, ok := <-closed
		assert.False(s.t, ok, "closing tells no error: %v", err)
		time.Sleep(200 * time.Millisecond) // the time for the broker to end the stream, if it does
		w.mu.Lock()
		ended := w.ended
		w.mu.Unlock()
		require.NoError(s.t, w.closeSocket())
		assert.NoError(s.t, ended, "the broker ended the stream before the client closed it")
	})
}

// endWatch is a client's socket that records a read ending before the socket is closed. Its
// Close leaves the socket open: the case closes it (closeSocket) once it has seen whether the
// broker ends the stream of itself.
type endWatch struct {
	net.Conn
	mu     sync.Mutex
	closed bool
	ended  error
}

func (w *endWatch) Read(p []byte) (int, error) {
	n, err := w.Conn.Read(p)
	if err != nil {
		w.mu.Lock()
		if !w.closed && w.ended == nil {
			w.ended = err
		}
		w.mu.Unlock()
	}
	return n, err
}

func (w *endWatch) Close() error { return nil }

func (w *endWatch) closeSocket() error {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	return w.Conn.Close()
}

// Where a message that comes back goes: a classic queue puts it where it was; a quorum queue
// gives what comes back out first, in the order it came back, but on 3.10 what its client
// requeues goes to its tail.
func TestWhereAMessageThatComesBackGoesIsTheQueuesAndTheVersions(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		require.NoError(s.t, ch.Confirm(false))
		version, _ := brokerVersion()
		for _, kind := range []string{"classic", "quorum"} {
			for _, how := range []string{"nack 2 then 0", "recover", "channel closed"} {
				q := s.name(kind + "." + strings.ReplaceAll(how, " ", "."))
				_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": kind})
				require.NoError(s.t, err)
				for _, b := range []string{"0", "1", "2", "3", "4"} {
					confirmed(s, ch, q, b)
				}
				held, err := conn.Channel()
				require.NoError(s.t, err)
				require.NoError(s.t, held.Qos(3, 0, false))
				ds, err := held.Consume(q, "held", false, false, false, false, nil)
				require.NoError(s.t, err)
				got := []amqp.Delivery{receive(s, ds), receive(s, ds), receive(s, ds)}
				require.NoError(s.t, held.Cancel("held", false))
				switch how {
				case "nack 2 then 0":
					require.NoError(s.t, got[2].Nack(false, true))
					require.NoError(s.t, got[0].Nack(false, true))
					require.NoError(s.t, got[1].Ack(false))
				case "recover":
					require.NoError(s.t, held.Recover(true)) //nolint:staticcheck // the broker still serves basic.recover: where its messages go is the case
				case "channel closed":
					require.NoError(s.t, held.Close())
				}
				want := map[string][]string{ // classic, and quorum queues of 4.0
					"nack 2 then 0":  {"0", "2", "3", "4"},
					"recover":        {"0", "1", "2", "3", "4"},
					"channel closed": {"0", "1", "2", "3", "4"},
				}[how]
				if kind == "quorum" {
					want = map[string][]string{
						"nack 2 then 0":  {"2", "0", "3", "4"},
						"recover":        {"0", "1", "2", "3", "4"},
						"channel closed": {"0", "1", "2", "3", "4"},
					}[how]
					if strings.HasPrefix(version, "3.") && how != "channel closed" {
						want = map[string][]string{
							"nack 2 then 0": {"3", "4", "2", "0"},
							"recover":       {"3", "4", "0", "1", "2"},
						}[how]
					}
				}
				// Once the queue holds them all again, gets see its order.
				require.Eventually(s.t, func() bool {
					state, err := ch.QueueDeclarePassive(q, true, false, false, false, amqp.Table{"x-queue-type": kind})
					require.NoError(s.t, err)
					return state.Messages == len(want)
				}, 5*time.Second, 10*time.Millisecond)
				assert.Equal(s.t, want, getAll(s, ch, q), "%s, %s", kind, how)
			}
		}
	})
}

// A quorum queue of RabbitMQ 4.0 has two priorities, high above 4: after what came back, it
// gives out two of the high one, then whichever of the two came first. 3.10's keeps one order,
// and puts what its client requeues at its tail.
func TestAQuorumQueueOf4HasTwoPriorities(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		require.NoError(s.t, ch.Confirm(false))
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		require.NoError(s.t, err)
		publishAll := func(bodies ...string) {
			for _, b := range bodies {
				priority := map[byte]uint8{'h': 9, 'f': 5, 'n': 0, 'o': 4}[b[0]]
				dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false,
					amqp.Publishing{Body: []byte(b), Priority: priority})
				require.NoError(s.t, err)
				require.True(s.t, dc.Wait())
			}
		}
		publishAll("n0")
		d, ok, err := ch.Get(q, false)
		require.NoError(s.t, err)
		require.True(s.t, ok)
		publishAll("h1", "f2", "h3", "n4", "h5", "o6", "n7", "h8")
		require.NoError(s.t, d.Nack(false, true)) // it goes out first
		got := getAll(s, ch, q)
		// The count goes on across the queue's life.
		publishAll("n9", "h10", "h11", "n12")
		got = append(got, getAll(s, ch, q)...)
		version, _ := brokerVersion()
		if strings.HasPrefix(version, "3.") {
			assert.Equal(s.t, []string{"h1", "f2", "h3", "n4", "h5", "o6", "n7", "h8", "n0", "n9", "h10", "h11", "n12"}, got)
		} else {
			assert.Equal(s.t, []string{"n0", "h1", "f2", "h3", "h5", "n4", "h8", "o6", "n7", "h10", "h11", "n9", "n12"}, got)
		}
	})
}

// A queue's arguments are checked as RabbitMQ checks them: the dead-letter exchange's type,
// the queue type, the arguments of other types of queue, each value's kind and bounds.
func TestAQueuesArgumentsAreCheckedAsRabbitMQChecksThem(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		for i, c := range []struct {
			kind    string
			args    amqp.Table
			refused string // with the queue named Q; "": taken
		}{
			{"classic", amqp.Table{"x-message-ttl": int32(-1)}, "invalid arg 'x-message-ttl' for queue 'Q' in vhost '/': {value_negative,-1}"},
			{"classic", amqp.Table{"x-message-ttl": "3"}, `invalid arg 'x-message-ttl' for queue 'Q' in vhost '/': "expected integer, got longstr"`},
			{"quorum", amqp.Table{"x-message-ttl": true}, `invalid arg 'x-message-ttl' for queue 'Q' in vhost '/': "expected integer, got bool"`},
			{"classic", amqp.Table{"x-message-ttl": int64(1) << 40}, "invalid arg 'x-message-ttl' for queue 'Q' in vhost '/': {value_too_large,1099511627776}"},
			{"classic", amqp.Table{"x-expires": int32(0)}, "invalid arg 'x-expires' for queue 'Q' in vhost '/': {value_zero,0}"},
			{"classic", amqp.Table{"x-max-priority": int32(300)}, "invalid arg 'x-max-priority' for queue 'Q' in vhost '/': {max_value_exceeded,300}"},
			{"stream", amqp.Table{"x-max-length-bytes": int32(-1)}, "invalid arg 'x-max-length-bytes' for queue 'Q' in vhost '/': {value_negative,-1}"},
			{"classic", amqp.Table{"x-overflow": "nope"}, "invalid arg 'x-overflow' for queue 'Q' in vhost '/': invalid_overflow"},
			{"classic", amqp.Table{"x-queue-type": "nope"}, `invalid arg 'x-queue-type' for queue 'Q' in vhost '/': "unsupported queue type 'nope'"`},
			{"classic", amqp.Table{"x-queue-type": int32(1)}, "invalid arg 'x-queue-type' for queue 'Q' in vhost '/': {unacceptable_type,signedint}"},
			{"quorum", amqp.Table{"x-single-active-consumer": "yes"}, "invalid arg 'x-single-active-consumer' for queue 'Q' in vhost '/': {unacceptable_type,longstr}"},
			{"classic", amqp.Table{"x-dead-letter-routing-key": "k"}, "invalid arg 'x-dead-letter-routing-key' for queue 'Q' in vhost '/': routing_key_but_no_dlx_defined"},
			{"classic", amqp.Table{"x-dead-letter-exchange": int32(1)}, "invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue 'Q' in vhost '/'"},
			{"classic", amqp.Table{"x-delivery-limit": int32(5)}, "invalid arg 'x-delivery-limit' for queue 'Q' in vhost '/' of queue type rabbit_classic_queue"},
			{"quorum", amqp.Table{"x-max-age": "1D"}, "invalid arg 'x-max-age' for queue 'Q' in vhost '/' of queue type rabbit_quorum_queue"},
			{"stream", amqp.Table{"x-message-ttl": int32(1000)}, "invalid arg 'x-message-ttl' for queue 'Q' in vhost '/' of queue type rabbit_stream_queue"},
			{"classic", amqp.Table{"x-queue-mode": "nope"}, `invalid arg 'x-queue-mode' for queue 'Q' in vhost '/': "unsupported queue mode 'nope'"`},
			{"classic", amqp.Table{"x-queue-version": int32(3)}, `invalid arg 'x-queue-version' for queue 'Q' in vhost '/': "unsupported queue version '3'"`},
			{"quorum", amqp.Table{"x-queue-leader-locator": "nope"}, "invalid arg 'x-queue-leader-locator' for queue 'Q' in vhost '/': invalid_queue_locator_arg"},
			{"quorum", amqp.Table{"x-dead-letter-strategy": "nope"}, "invalid arg 'x-dead-letter-strategy' for queue 'Q' in vhost '/': invalid_dlx_strategy"},
			{"quorum", amqp.Table{"x-quorum-initial-group-size": int32(0)}, "invalid arg 'x-quorum-initial-group-size' for queue 'Q' in vhost '/': {value_zero,0}"},
			{"classic", amqp.Table{"x-max-length": uint8(3), "x-message-ttl": int8(0), "x-queue-mode": "lazy", "x-queue-version": int32(2)}, ""},
			{"quorum", amqp.Table{"x-queue-leader-locator": "balanced", "x-dead-letter-strategy": "at-least-once"}, ""},
			{"quorum", amqp.Table{"x-delivery-limit": "any", "x-unknown": amqp.Table{}}, ""},
		} {
			ch, err := conn.Channel()
			require.NoError(s.t, err)
			q := s.name(fmt.Sprintf("%s.%d", c.kind, i))
			args := amqp.Table{"x-queue-type": c.kind}
			maps.Copy(args, c.args)
			_, err = ch.QueueDeclare(q, true, false, false, false, args)
			if c.refused == "" {
				assert.NoError(s.t, err, "%s %v", c.kind, c.args)
				_ = ch.Close()
				continue
			}
			var amqpErr *amqp.Error
			if assert.ErrorAs(s.t, err, &amqpErr, "%s %v", c.kind, c.args) {
				assert.Equal(s.t, amqp.PreconditionFailed, amqpErr.Code)
				assert.Equal(s.t, "PRECONDITION_FAILED - "+c.refused, strings.ReplaceAll(amqpErr.Reason, "'"+q+"'", "'Q'"))
			}
		}
	})
}

// A message's expiration is a whole number of milliseconds: a publish with another closes its
// channel with 406.
func TestAMessagesExpirationIsAWholeNumberOfMilliseconds(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		q := s.name("q")
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		_, err = ch.QueueDeclare(q, true, false, false, false, nil)
		require.NoError(s.t, err)
		for _, c := range []struct{ expiration, refused string }{
			{"abc", "no_integer"},
			{"-1", "{value_negative,-1}"},
			{"1.5", `{leftover_string,".5"}`},
			{"4294967296", ""},
			{"+60000", ""},
			{"0", ""},
		} {
			ch, err := conn.Channel()
			require.NoError(s.t, err)
			require.NoError(s.t, ch.Confirm(false))
			closed := ch.NotifyClose(make(chan *amqp.Error, 1))
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false,
				amqp.Publishing{Body: []byte(c.expiration), Expiration: c.expiration})
			require.NoError(s.t, err)
			if c.refused == "" {
				assert.True(s.t, dc.Wait(), c.expiration)
				continue
			}
			e, _ := within(s, closed, "no close of "+c.expiration)
			if assert.NotNil(s.t, e, c.expiration) {
				assert.Equal(s.t, amqp.PreconditionFailed, e.Code)
				assert.Equal(s.t, "PRECONDITION_FAILED - invalid expiration '"+c.expiration+"': "+c.refused, e.Reason)
			}
		}
		ch, err = conn.Channel()
		require.NoError(s.t, err)
		assert.Equal(s.t, []string{"4294967296", "+60000"}, getAll(s, ch, q), "the one of 0 expired in the queue, the refused never came")
	})
}

// A message due as it arrives (a TTL of 0) goes to a consumer that can take it, and expires
// otherwise.
func TestAMessageDueAsItArrivesGoesToAWaitingConsumerOrExpires(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		dlx, dead := deadLetterTo(s, ch)
		for _, kind := range []string{"classic", "quorum"} {
			for _, queueTTL := range []bool{false, true} {
				args := amqp.Table{"x-queue-type": kind, "x-dead-letter-exchange": dlx}
				p := amqp.Publishing{Body: []byte("waited for"), Expiration: "0"}
				if queueTTL {
					args["x-message-ttl"], p.Expiration = int32(0), ""
				}
				q := s.name(fmt.Sprintf("%s.%t", kind, queueTTL))
				_, err := ch.QueueDeclare(q, true, false, false, false, args)
				require.NoError(s.t, err)
				publish(s, ch, "", q, amqp.Publishing{Body: []byte("alone"), Expiration: p.Expiration})
				d := receive(s, dead)
				assert.Equal(s.t, "alone", string(d.Body))
				assert.Equal(s.t, "expired", death(s, d)["reason"])
				ds, err := ch.Consume(q, q, true, false, false, false, nil)
				require.NoError(s.t, err)
				publish(s, ch, "", q, p)
				assert.Equal(s.t, "waited for", string(receive(s, ds).Body), "%s, queue TTL %t", kind, queueTTL)
				require.NoError(s.t, ch.Cancel(q, false))
			}
		}
		none(s, dead)
	})
}

// A prefetch of a size in bytes is not implemented: the broker closes the connection with 540.
func TestAPrefetchSizeClosesTheConnection(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		closed := conn.NotifyClose(make(chan *amqp.Error, 1))
		err = ch.Qos(1, 100, false)
		var amqpErr *amqp.Error
		require.ErrorAs(s.t, err, &amqpErr)
		assert.Equal(s.t, amqp.NotImplemented, amqpErr.Code)
		assert.Equal(s.t, "NOT_IMPLEMENTED - prefetch_size!=0 (100)", amqpErr.Reason)
		e, _ := within(s, closed, "the connection stays open")
		assert.NotNil(s.t, e)
	})
}

// A headers binding of x-match all-with-x or any-with-x matches its "x-" arguments too; another
// x-match is refused.
func TestHeadersBindingsWithXMatchXArgumentsAndRefuseOtherModes(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		x := s.name("x")
		require.NoError(s.t, ch.ExchangeDeclare(x, "headers", false, false, false, false, nil))
		all, anyq := s.name("all"), s.name("any")
		for _, q := range []string{all, anyq} {
			_, err = ch.QueueDeclare(q, false, false, false, false, nil)
			require.NoError(s.t, err)
		}
		require.NoError(s.t, ch.QueueBind(all, "", x, false, amqp.Table{"x-match": "all-with-x", "x-a": "1", "b": "2"}))
		require.NoError(s.t, ch.QueueBind(anyq, "", x, false, amqp.Table{"x-match": "any-with-x", "x-a": "1", "x-b": "2"}))
		for body, h := range map[string]amqp.Table{
			"both": {"x-a": "1", "b": "2"}, "b only": {"b": "2"}, "x-b": {"x-b": "2"}, "wrong": {"x-a": "2"},
		} {
			publish(s, ch, x, "", amqp.Publishing{Body: []byte(body), Headers: h})
		}
		get := func(q string) []string {
			got := getAll(s, ch, q)
			slices.Sort(got)
			return got
		}
		assert.Equal(s.t, []string{"both"}, get(all))
		assert.Equal(s.t, []string{"both", "x-b"}, get(anyq))
		for mode, refused := range map[any]string{
			"some":   `Invalid x-match field value <<"some">>; expected all, any, all-with-x, or any-with-x`,
			int32(1): "Invalid x-match field type signedint (value 1); expected longstr",
		} {
			ch, err := conn.Channel()
			require.NoError(s.t, err)
			err = ch.QueueBind(all, "k", x, false, amqp.Table{"x-match": mode})
			refusedWith(s, err, "PRECONDITION_FAILED - "+refused, mode)
		}
	})
}

// The CC and BCC headers (arrays of keys) add routing keys; BCC is taken out of the message.
// Dead-lettering routes by them too and names them in x-death; a dead-letter routing key
// replaces them (and RabbitMQ 3.10 drops CC). A CC that is not an array is refused.
func TestCCAndBCCHeadersAddRoutingKeys(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		x := s.name("x")
		require.NoError(s.t, ch.ExchangeDeclare(x, "direct", false, false, false, false, nil))
		for _, k := range []string{"a", "b", "c"} {
			q := s.name(k)
			_, err = ch.QueueDeclare(q, false, false, false, false, nil)
			require.NoError(s.t, err)
			require.NoError(s.t, ch.QueueBind(q, k, x, false, nil))
		}
		publish(s, ch, x, "a", amqp.Publishing{Body: []byte("m"), Headers: amqp.Table{"CC": []any{"b"}, "BCC": []any{"c"}}})
		for _, k := range []string{"a", "b", "c"} {
			d, ok, err := ch.Get(s.name(k), true)
			require.NoError(s.t, err)
			if assert.True(s.t, ok, k) {
				assert.Equal(s.t, "a", d.RoutingKey)
				assert.Equal(s.t, amqp.Table{"CC": []any{"b"}}, d.Headers, k)
			}
		}
		// Dead-lettered from two queues the default exchange reaches by the key and CC.
		dlx, dead := deadLetterTo(s, ch)
		kept, replaced := s.name("kept"), s.name("replaced")
		for q, args := range map[string]amqp.Table{
			kept:     {"x-dead-letter-exchange": dlx, "x-message-ttl": int32(10)},
			replaced: {"x-dead-letter-exchange": dlx, "x-message-ttl": int32(10), "x-dead-letter-routing-key": "z"},
		} {
			_, err = ch.QueueDeclare(q, true, false, false, false, args)
			require.NoError(s.t, err)
		}
		publish(s, ch, "", kept, amqp.Publishing{Body: []byte("m"), Headers: amqp.Table{"CC": []any{replaced}}})
		got := map[string]amqp.Delivery{}
		for range 2 {
			d := receive(s, dead)
			got[death(s, d)["queue"].(string)] = d
		}
		version, _ := brokerVersion()
		for q, want := range map[string]struct {
			key string
			cc  any
		}{kept: {kept, []any{replaced}}, replaced: {"z", map[bool]any{true: nil, false: []any{replaced}}[strings.HasPrefix(version, "3.")]}} {
			d := got[q]
			assert.Equal(s.t, want.key, d.RoutingKey, q)
			assert.Equal(s.t, want.cc, d.Headers["CC"], q)
			assert.Equal(s.t, []any{kept, replaced}, death(s, d)["routing-keys"], q)
		}
		none(s, dead)
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		require.NoError(s.t, ch.PublishWithContext(context.Background(), "", kept, false, false,
			amqp.Publishing{Headers: amqp.Table{"CC": "b"}}))
		e, _ := within(s, closed, "the channel stays open")
		if assert.NotNil(s.t, e) {
			assert.Equal(s.t, `PRECONDITION_FAILED - invalid message: {unacceptable_type_in_header,"CC",longstr}`, e.Reason)
		}
	})
}

// Unbinding a queue or an exchange that is not there, or from one that is not, is done.
func TestUnbindingWhatIsNotThereIsDone(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, false, false, false, false, nil)
		require.NoError(s.t, err)
		assert.NoError(s.t, ch.QueueUnbind(q, "k", s.name("missing"), nil))
		assert.NoError(s.t, ch.QueueUnbind(s.name("missing"), "k", "amq.direct", nil))
		assert.NoError(s.t, ch.ExchangeUnbind(s.name("missing"), "k", "amq.direct", false, nil))
		assert.NoError(s.t, ch.QueueUnbind(q, "never bound", "amq.direct", nil))
		_, err = ch.QueueDeclarePassive(q, false, false, false, false, nil)
		assert.NoError(s.t, err, "the channel is open")
	})
}

// What RabbitMQ does not implement closes the connection with 540: a publish with immediate,
// channel.flow asking to stop.
// An exchange of an unknown type is refused: on 3.10 by closing the connection (503), on 4.0
// the channel (406).
func TestWhatRabbitMQDoesNotImplementAndAnUnknownExchangeTypeAreRefused(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		closed := conn.NotifyClose(make(chan *amqp.Error, 1))
		require.NoError(s.t, ch.PublishWithContext(context.Background(), "", "q", false, true, amqp.Publishing{}))
		e, _ := within(s, closed, "the connection stays open")
		if assert.NotNil(s.t, e) {
			assert.Equal(s.t, amqp.NotImplemented, e.Code)
			assert.Equal(s.t, "NOT_IMPLEMENTED - immediate=true", e.Reason)
		}
		conn = s.dial()
		ch, err = conn.Channel()
		require.NoError(s.t, err)
		require.NoError(s.t, ch.Flow(true))
		err = ch.Flow(false)
		refusedWith(s, err, "NOT_IMPLEMENTED - active=false")
		conn = s.dial()
		ch, err = conn.Channel()
		require.NoError(s.t, err)
		x := s.name("x")
		closed = conn.NotifyClose(make(chan *amqp.Error, 1))
		err = ch.ExchangeDeclare(x, "x-unknown", false, true, false, false, nil)
		var amqpErr *amqp.Error
		require.ErrorAs(s.t, err, &amqpErr)
		version, _ := brokerVersion()
		if strings.HasPrefix(version, "3.") {
			assert.Equal(s.t, amqp.CommandInvalid, amqpErr.Code)
			assert.Equal(s.t, "COMMAND_INVALID - unknown exchange type 'x-unknown'", amqpErr.Reason)
			e, _ := within(s, closed, "the connection stays open")
			assert.NotNil(s.t, e)
		} else {
			assert.Equal(s.t, amqp.PreconditionFailed, amqpErr.Code)
			assert.Equal(s.t, "PRECONDITION_FAILED - unknown exchange type 'x-unknown'", amqpErr.Reason)
			assert.False(s.t, conn.IsClosed(), "only the channel closes")
		}
	})
}

// A consumer of a higher priority (x-priority) gets the messages while it has room; the others
// share the rest. A priority that is not an integer is refused.
func TestAConsumerOfAHigherPriorityIsServedFirst(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		for _, kind := range []string{"classic", "quorum"} {
			ch, err := conn.Channel()
			require.NoError(s.t, err)
			q := s.name(kind)
			_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": kind})
			require.NoError(s.t, err)
			low, err := ch.Consume(q, "low", false, false, false, false, nil)
			require.NoError(s.t, err)
			highCh, err := conn.Channel()
			require.NoError(s.t, err)
			require.NoError(s.t, highCh.Qos(2, 0, false))
			high, err := highCh.Consume(q, "high", false, false, false, false, amqp.Table{"x-priority": int32(10)})
			require.NoError(s.t, err)
			for i := range 6 {
				publish(s, ch, "", q, amqp.Publishing{Body: []byte(strconv.Itoa(i))})
			}
			got := map[string][]string{}
			for range 6 {
				select {
				case d := <-low:
					got["low"] = append(got["low"], string(d.Body))
				case d := <-high:
					got["high"] = append(got["high"], string(d.Body))
				case <-time.After(5 * time.Second):
					s.t.Fatalf("%s: %v so far", kind, got)
				}
			}
			assert.Equal(s.t, map[string][]string{"high": {"0", "1"}, "low": {"2", "3", "4", "5"}}, got, kind)
		}
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		_, err = ch.Consume(s.name("classic"), "bad", false, false, false, false, amqp.Table{"x-priority": "a"})
		refusedWith(s, err, fmt.Sprintf(`PRECONDITION_FAILED - invalid arg 'x-priority' for queue '%s' in vhost '/': "expected integer, got longstr"`, s.name("classic")))
	})
}

// In a transaction (tx.select) publishes and settlements wait for tx.commit; tx.rollback drops
// them, and what was settled is unacked again. A channel is transactional or confirms, not both.
func TestATransactionPublishesAndSettlesAtItsCommit(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		q := s.name("q")
		plain, err := conn.Channel()
		require.NoError(s.t, err)
		_, err = plain.QueueDeclare(q, false, false, false, false, nil)
		require.NoError(s.t, err)
		count := func() int {
			state, err := plain.QueueDeclarePassive(q, false, false, false, false, nil)
			require.NoError(s.t, err)
			return state.Messages
		}
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		require.NoError(s.t, ch.Tx())
		returns := ch.NotifyReturn(make(chan amqp.Return, 1))
		for _, b := range []string{"dropped", "a", "b"} {
			require.NoError(s.t, ch.PublishWithContext(context.Background(), "", q, false, false, amqp.Publishing{Body: []byte(b)}))
			if b == "dropped" {
				assert.Equal(s.t, 0, count(), "published in the transaction")
				require.NoError(s.t, ch.TxRollback())
			}
		}
		require.NoError(s.t, ch.PublishWithContext(context.Background(), "", s.name("nowhere"), true, false, amqp.Publishing{}))
		assert.Equal(s.t, 0, count(), "published in the transaction")
		require.NoError(s.t, ch.TxCommit())
		r, _ := within(s, returns, "no return")
		assert.Equal(s.t, "NO_ROUTE", r.ReplyText, "returned at the commit")
		assert.Equal(s.t, 2, count())
		d, ok, err := ch.Get(q, false)
		require.NoError(s.t, err)
		require.True(s.t, ok)
		require.NoError(s.t, d.Ack(false))
		require.NoError(s.t, ch.TxRollback())
		require.NoError(s.t, d.Ack(false), "unacked again")
		require.NoError(s.t, ch.TxCommit())
		d, ok, err = ch.Get(q, false)
		require.NoError(s.t, err)
		require.True(s.t, ok)
		require.NoError(s.t, d.Nack(false, true))
		assert.Equal(s.t, 0, count(), "nacked in the transaction")
		require.NoError(s.t, ch.TxCommit())
		assert.Equal(s.t, []string{"b"}, getAll(s, plain, q))
		for _, c := range []struct {
			first, then func(*amqp.Channel) error
			refused     string
		}{
			{(*amqp.Channel).Tx, func(ch *amqp.Channel) error { return ch.Confirm(false) }, "cannot switch from tx to confirm mode"},
			{func(ch *amqp.Channel) error { return ch.Confirm(false) }, (*amqp.Channel).Tx, "cannot switch from confirm to tx mode"},
			{func(*amqp.Channel) error { return nil }, (*amqp.Channel).TxCommit, "channel is not transactional"},
			{func(*amqp.Channel) error { return nil }, (*amqp.Channel).TxRollback, "channel is not transactional"},
		} {
			ch, err := conn.Channel()
			require.NoError(s.t, err)
			require.NoError(s.t, c.first(ch))
			err = c.then(ch)
			refusedWith(s, err, "PRECONDITION_FAILED - "+c.refused, c.refused)
		}
	})
}

// With a single active consumer, a quorum queue of RabbitMQ 4.0 hands over to a consumer of a
// higher priority once the active one has nothing unacked, and gives neither more till then;
// 3.10's, and a classic queue, keep the first.
func TestASingleActiveConsumerGivesWayToAHigherPriorityOn4(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		version, _ := brokerVersion()
		for _, kind := range []string{"classic", "quorum"} {
			ch, err := conn.Channel()
			require.NoError(s.t, err)
			q := s.name(kind)
			_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": kind, "x-single-active-consumer": true})
			require.NoError(s.t, err)
			firstCh, err := conn.Channel()
			require.NoError(s.t, err)
			require.NoError(s.t, firstCh.Qos(1, 0, false))
			first, err := firstCh.Consume(q, "first", false, false, false, false, nil)
			require.NoError(s.t, err)
			publish(s, ch, "", q, amqp.Publishing{Body: []byte("0")})
			held := receive(s, first)
			secondCh, err := conn.Channel()
			require.NoError(s.t, err)
			second, err := secondCh.Consume(q, "second", true, false, false, false, amqp.Table{"x-priority": int32(10)})
			require.NoError(s.t, err)
			for _, b := range []string{"1", "2"} {
				publish(s, ch, "", q, amqp.Publishing{Body: []byte(b)})
			}
			handsOver := kind == "quorum" && !strings.HasPrefix(version, "3.")
			if handsOver {
				none(s, first)
				none(s, second)
			}
			require.NoError(s.t, held.Ack(false))
			var got []string
			for range 2 {
				select {
				case d := <-first:
					got = append(got, "first "+string(d.Body))
					require.NoError(s.t, d.Ack(false))
				case d := <-second:
					got = append(got, "second "+string(d.Body))
				case <-time.After(5 * time.Second):
					s.t.Fatalf("%s: %v so far", kind, got)
				}
			}
			if handsOver {
				assert.Equal(s.t, []string{"second 1", "second 2"}, got, kind)
			} else {
				assert.Equal(s.t, []string{"first 1", "first 2"}, got, kind)
			}
		}
	})
}

// The broker takes headers of any depth and length that fit its frame (beyond what amqp091-go
// reads: a consumer needs warren's guard to read them, see internal/amqpx).
func TestHeadersOfAnyDepthAndLengthAreTaken(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		require.NoError(s.t, ch.Confirm(false))
		q := s.name("q")
		_, err = ch.QueueDeclare(q, false, false, false, false, nil)
		require.NoError(s.t, err)
		for _, h := range []amqp.Table{testenv.NestedTable(33), testenv.ManyHeaders(8193), {"arr": make([]any, 8193)}} {
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false, amqp.Publishing{Headers: h})
			require.NoError(s.t, err)
			assert.True(s.t, dc.Wait())
		}
		state, err := ch.QueueDeclarePassive(q, false, false, false, false, nil)
		require.NoError(s.t, err)
		assert.Equal(s.t, 3, state.Messages)
		n, err := ch.QueuePurge(q, false)
		require.NoError(s.t, err)
		assert.Equal(s.t, 3, n)
	})
}

// A headers binding matches a header's value as RabbitMQ compares them: strings and byte
// strings by their bytes, integers of any width by value, floats and doubles by value; an
// integer and a float by value on 3.10, never on 4.0; nothing across other kinds.
func TestAHeadersBindingComparesValuesByKind(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		for i, c := range []struct {
			bind, header any
			matches      bool
		}{
			{"2", "2", true}, {"2", []byte("2"), true}, {int32(2), int64(2), true}, {int8(2), uint16(2), true},
			{float64(1.5), float32(1.5), true}, {true, true, true},
			{int32(2), "2", false}, {"true", true, false}, {int32(1), true, false}, {int32(2), float64(2), false},
		} {
			if version, _ := brokerVersion(); strings.HasPrefix(version, "3.") && c.bind == int32(2) && c.header == float64(2) {
				c.matches = true
			}
			x, q := s.name(fmt.Sprint("x", i)), s.name(fmt.Sprint("q", i))
			require.NoError(s.t, ch.ExchangeDeclare(x, "headers", false, false, false, false, nil))
			_, err = ch.QueueDeclare(q, false, false, false, false, nil)
			require.NoError(s.t, err)
			require.NoError(s.t, ch.QueueBind(q, "", x, false, amqp.Table{"k": c.bind}))
			publish(s, ch, x, "", amqp.Publishing{Headers: amqp.Table{"k": c.header}})
			_, got, err := ch.Get(q, true)
			require.NoError(s.t, err)
			assert.Equal(s.t, c.matches, got, "bound to %T %[1]v, header %T %[2]v", c.bind, c.header)
		}
	})
}

// A negative x-delivery-limit means no limit on RabbitMQ 4.0; on 3.10 the first return is
// over it. A limit of 0 dead-letters at the first return on both.
func TestANegativeDeliveryLimitIsTheVersions(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		dlx, dead := deadLetterTo(s, ch)
		require.NoError(s.t, ch.Confirm(false))
		version, _ := brokerVersion()
		for _, limit := range []int32{-1, 0} {
			q := s.name(fmt.Sprint("q", limit))
			args := amqp.Table{"x-queue-type": "quorum", "x-delivery-limit": limit, "x-dead-letter-exchange": dlx}
			_, err = ch.QueueDeclare(q, true, false, false, false, args)
			require.NoError(s.t, err)
			confirmed(s, ch, q, "again")
			deadAfter := 0 // deliveries
			for got := 1; got <= 25 && deadAfter == 0; got++ {
				d, ok, err := ch.Get(q, false)
				require.NoError(s.t, err)
				require.True(s.t, ok, "limit %d, delivery %d", limit, got)
				require.NoError(s.t, d.Nack(false, true))
				require.Eventually(s.t, func() bool { // back in the queue, or dead-lettered
					select {
					case <-dead:
						deadAfter = got
						return true
					default:
					}
					state, err := ch.QueueDeclarePassive(q, true, false, false, false, args)
					require.NoError(s.t, err)
					return state.Messages == 1
				}, 5*time.Second, 5*time.Millisecond)
			}
			want := 1
			if limit < 0 && !strings.HasPrefix(version, "3.") {
				want = 0 // never
			}
			assert.Equal(s.t, want, deadAfter, "limit %d", limit)
		}
	})
}

// A quorum queue with a single active consumer refuses basic.get (405), with or without a
// consumer; a classic one serves it.
func TestAQuorumQueueWithASingleActiveConsumerRefusesGet(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		for _, kind := range []string{"classic", "quorum"} {
			ch, err := conn.Channel()
			require.NoError(s.t, err)
			require.NoError(s.t, ch.Confirm(false))
			q := s.name(kind)
			_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": kind, "x-single-active-consumer": true})
			require.NoError(s.t, err)
			confirmed(s, ch, q, "m")
			d, ok, err := ch.Get(q, true)
			if kind == "classic" {
				require.NoError(s.t, err)
				assert.True(s.t, ok)
				assert.Equal(s.t, "m", string(d.Body))
				continue
			}
			var amqpErr *amqp.Error
			if assert.ErrorAs(s.t, err, &amqpErr) {
				assert.Equal(s.t, amqp.ResourceLocked, amqpErr.Code)
				assert.Equal(s.t, fmt.Sprintf("RESOURCE_LOCKED - cannot obtain access to locked queue '%s' in vhost '/'. "+
					"basic.get operations are not supported by quorum queues with single active consumer", q), amqpErr.Reason)
			}
		}
	})
}

// A consumer's arguments are checked against its queue's type: x-priority is for classic and
// quorum queues, x-stream-offset for streams; one a version does not know is ignored. A stream
// is read with a prefetch of the consumer's own (a channel's global one does not count).
func TestAConsumersArgumentsAreTheQueueTypes(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		version, _ := brokerVersion()
		for _, kind := range []string{"classic", "quorum", "stream"} {
			ch, err := conn.Channel()
			require.NoError(s.t, err)
			q := s.name(kind)
			_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-queue-type": kind})
			require.NoError(s.t, err)
			for arg, takes := range map[string][]string{
				"x-priority": {"classic", "quorum"}, "x-stream-offset": {"stream"}, "x-credit": {"classic", "quorum", "stream"},
			} {
				ch, err := conn.Channel()
				require.NoError(s.t, err)
				require.NoError(s.t, ch.Qos(1, 0, false))
				v := map[string]any{"x-priority": int32(1), "x-stream-offset": "first", "x-credit": amqp.Table{}}[arg]
				_, err = ch.Consume(q, "", false, false, false, false, amqp.Table{arg: v})
				if slices.Contains(takes, kind) {
					assert.NoError(s.t, err, "%s, %s", kind, arg)
					continue
				}
				refusedWith(s, err, fmt.Sprintf("PRECONDITION_FAILED - invalid arg '%s' for queue '%s' in vhost '/' of queue type rabbit_%s_queue",
					arg, q, kind), "%s, %s", kind, arg)
			}
		}
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		require.NoError(s.t, ch.Qos(10, 0, true))
		_, err = ch.Consume(s.name("stream"), "", false, false, false, false, nil)
		want := fmt.Sprintf("PRECONDITION_FAILED - consumer prefetch count is not set for stream queue '%s' in vhost '/'", s.name("stream"))
		if strings.HasPrefix(version, "3.") {
			want = fmt.Sprintf("PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '%s' in vhost '/''", s.name("stream"))
		}
		refusedWith(s, err, want)
	})
}

// A redeclaration that differs from the declaration is refused with what differs: of a queue,
// its exclusive property (405), durable, auto-delete, then an argument its type takes (integers
// of any width are one value; other arguments may differ); of an exchange, its type, durable,
// auto-delete, internal, its alternate exchange. A reply longer than 255 bytes is cut to 252
// and "...".
func TestARedeclarationThatDiffersIsRefusedWithWhatDiffers(t *testing.T) {
	conformance(t, func(s side) {
		conn := s.dial()
		ch, err := conn.Channel()
		require.NoError(s.t, err)
		q := s.name(strings.Repeat("q", 60))
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-message-ttl": int32(100), "x-max-length": int32(5)})
		require.NoError(s.t, err)
		x := s.name("x")
		require.NoError(s.t, ch.ExchangeDeclare(x, "direct", true, false, false, false, amqp.Table{"alternate-exchange": "ae"}))
		refused := func(err error) (string, uint16) {
			var amqpErr *amqp.Error
			if !errors.As(err, &amqpErr) {
				return fmt.Sprint(err), 0
			}
			return amqpErr.Reason, uint16(amqpErr.Code)
		}
		cut := func(text string) string {
			if len(text) > 255 {
				return text[:252] + "..."
			}
			return text
		}
		locked := cut(fmt.Sprintf("RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '%s' in vhost '/'. "+
			"It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.", q))
		inequivalent := func(what, detail string) string {
			return cut(fmt.Sprintf("PRECONDITION_FAILED - inequivalent arg %s in vhost '/': %s", what, detail))
		}
		ofQ := func(arg string) string { return fmt.Sprintf("'%s' for queue '%s'", arg, q) }
		for _, c := range []struct {
			durable, autoDelete, exclusive bool
			args                           amqp.Table
			refused                        string
		}{
			{true, false, true, amqp.Table{"x-message-ttl": int32(100), "x-max-length": int32(5)}, locked},
			{false, false, false, amqp.Table{"x-message-ttl": int32(100), "x-max-length": int32(5)}, inequivalent(ofQ("durable"), "received 'false' but current is 'true'")},
			{true, true, false, amqp.Table{"x-message-ttl": int32(100), "x-max-length": int32(5)}, inequivalent(ofQ("auto_delete"), "received 'true' but current is 'false'")},
			{true, false, false, amqp.Table{"x-message-ttl": int32(200), "x-max-length": int32(5)}, inequivalent(ofQ("x-message-ttl"), "received '200' but current is '100'")},
			{true, false, false, amqp.Table{"x-max-length": int32(5)}, inequivalent(ofQ("x-message-ttl"), "received none but current is the value '100' of type 'signedint'")},
			{true, false, false, amqp.Table{"x-message-ttl": int32(100), "x-max-length": int32(5), "x-expires": int32(1000)},
				inequivalent(ofQ("x-expires"), "received the value '1000' of type 'signedint' but current is none")},
			{true, false, false, amqp.Table{"x-message-ttl": int64(100), "x-max-length": int8(5), "x-foo": "bar", "x-queue-type": "classic"}, ""},
		} {
			ch, err := conn.Channel()
			require.NoError(s.t, err)
			_, err = ch.QueueDeclare(q, c.durable, c.autoDelete, c.exclusive, false, c.args)
			if c.refused == "" {
				assert.NoError(s.t, err, "%v", c.args)
				continue
			}
			reason, _ := refused(err)
			assert.Equal(s.t, c.refused, reason)
		}
		ofX := func(arg string) string { return fmt.Sprintf("'%s' for exchange '%s'", arg, x) }
		for _, c := range []struct {
			kind                          string
			durable, autoDelete, internal bool
			args                          amqp.Table
			refused                       string
		}{
			{"fanout", true, false, false, amqp.Table{"alternate-exchange": "ae"}, inequivalent(ofX("type"), "received 'fanout' but current is 'direct'")},
			{"direct", false, false, false, amqp.Table{"alternate-exchange": "ae"}, inequivalent(ofX("durable"), "received 'false' but current is 'true'")},
			{"direct", true, false, true, amqp.Table{"alternate-exchange": "ae"}, inequivalent(ofX("internal"), "received 'true' but current is 'false'")},
			{"direct", true, false, false, amqp.Table{"alternate-exchange": "other"}, inequivalent(ofX("alternate-exchange"), "received 'other' but current is 'ae'")},
			{"direct", true, false, false, nil, inequivalent(ofX("alternate-exchange"), "received none but current is the value 'ae' of type 'longstr'")},
			{"direct", true, false, false, amqp.Table{"alternate-exchange": "ae", "x-foo": "bar"}, ""},
		} {
			ch, err := conn.Channel()
			require.NoError(s.t, err)
			err = ch.ExchangeDeclare(x, c.kind, c.durable, c.autoDelete, c.internal, false, c.args)
			if c.refused == "" {
				assert.NoError(s.t, err, "%v", c.args)
				continue
			}
			reason, code := refused(err)
			assert.Equal(s.t, c.refused, reason)
			assert.Equal(s.t, uint16(amqp.PreconditionFailed), code)
		}
		ch, err = conn.Channel()
		require.NoError(s.t, err)
		reason, _ := refused(ch.ExchangeDelete("amq.direct", false, false))
		assert.Equal(s.t, "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed", reason)
	})
}

// A message larger than the broker's maximum is refused (406, the channel closes): 16 MiB from
// RabbitMQ 4.0, 128 MiB on 3.10.
func TestAMessageOverTheVersionsMaximumSizeIsRefused(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		q := s.name("q")
		_, err = ch.QueueDeclare(q, false, false, false, false, nil)
		require.NoError(s.t, err)
		require.NoError(s.t, ch.Confirm(false))
		closed := ch.NotifyClose(make(chan *amqp.Error, 1))
		size := 16<<20 + 1
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false, amqp.Publishing{Body: make([]byte, size)})
		require.NoError(s.t, err)
		if version, _ := brokerVersion(); strings.HasPrefix(version, "3.") {
			assert.True(s.t, dc.Wait(), "taken on 3.10")
			return
		}
		e, _ := within(s, closed, "the channel stays open")
		if assert.NotNil(s.t, e) {
			assert.Equal(s.t, fmt.Sprintf("PRECONDITION_FAILED - message size %d is larger than configured max size %d", size, 16<<20), e.Reason)
		}
	})
}

// A message expires only when it is the next to go out: in a quorum queue of 4.0 a message of
// the high priority goes out before an older one of the normal priority, which waits for it
// past its expiration; on 3.10 the older one is the head and expires.
func TestAMessageExpiresOnlyWhenItIsTheNextToGoOut(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		dlx, dead := deadLetterTo(s, ch)
		require.NoError(s.t, ch.Confirm(false))
		q := s.name("q")
		args := amqp.Table{"x-queue-type": "quorum", "x-dead-letter-exchange": dlx}
		_, err = ch.QueueDeclare(q, true, false, false, false, args)
		require.NoError(s.t, err)
		for _, p := range []amqp.Publishing{{Body: []byte("normal"), Expiration: "100"}, {Body: []byte("high"), Priority: 9}} {
			dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", q, false, false, p)
			require.NoError(s.t, err)
			require.True(s.t, dc.Wait())
		}
		if version, _ := brokerVersion(); strings.HasPrefix(version, "3.") {
			assert.Equal(s.t, "normal", string(receive(s, dead).Body))
			assert.Equal(s.t, []string{"high"}, getAll(s, ch, q))
			return
		}
		time.Sleep(400 * time.Millisecond)
		state, err := ch.QueueDeclarePassive(q, true, false, false, false, args)
		require.NoError(s.t, err)
		assert.Equal(s.t, 2, state.Messages, "the normal one waits, expired")
		none(s, dead)
		d, ok, err := ch.Get(q, true)
		require.NoError(s.t, err)
		require.True(s.t, ok)
		assert.Equal(s.t, "high", string(d.Body))
		assert.Zero(s.t, d.MessageCount, "the normal one expired as it came next")
		assert.Equal(s.t, "normal", string(receive(s, dead).Body))
		assert.Empty(s.t, getAll(s, ch, q))
	})
}

// A message that expired behind the head is dead-lettered when the head goes out, and reaches
// the consumer of the queue it is dead-lettered to at once.
func TestAMessageThatExpiredBehindTheHeadIsDeadLetteredWhenTheHeadGoes(t *testing.T) {
	conformance(t, func(s side) {
		ch, err := s.dial().Channel()
		require.NoError(s.t, err)
		dlx, dead := deadLetterTo(s, ch) // consumed before q is
		q := s.name("q")
		_, err = ch.QueueDeclare(q, true, false, false, false, amqp.Table{"x-dead-letter-exchange": dlx})
		require.NoError(s.t, err)
		publish(s, ch, "", q, amqp.Publishing{Body: []byte("head")})
		publish(s, ch, "", q, amqp.Publishing{Body: []byte("behind"), Expiration: "50"})
		time.Sleep(200 * time.Millisecond)
		none(s, dead)
		ds, err := ch.Consume(q, "", true, false, false, false, nil)
		require.NoError(s.t, err)
		assert.Equal(s.t, "head", string(receive(s, ds).Body))
		d := receive(s, dead)
		assert.Equal(s.t, "behind", string(d.Body))
		assert.Equal(s.t, "expired", death(s, d)["reason"])
	})
}
