package statequeue_test

import (
	"context"
	"math"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/statequeue"
	"github.com/warrenmq/warren/internal/testenv"
)

// BenchmarkLockAfterALostHolder measures how often the lock of a kill state queue is free
// again while a message that its lost holder got is still out (out/op, from 0 to 1: the
// window that statequeue.Read waits out). Each round, a holder takes the lock and gets the
// state's one message on a connection through a proxy, the proxy drops the connection, and
// another connection takes the lock as soon as it can (without Lock's pauses) and asks the
// state queue's counts; it then waits for the message to be back. docs/decisions.md gives
// the figures and the load they were measured under:
//
//	go test -run '^$' -bench LockAfterALostHolder -benchtime 300x ./internal/statequeue/
func BenchmarkLockAfterALostHolder(b *testing.B) {
	env := testenv.New(b)
	state, lock := env.Queue("state"), env.Queue("lock")
	direct, err := env.Dial()
	if err != nil {
		b.Fatal(err)
	}
	defer direct.Close()
	err = statequeue.OnChannel(direct, func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(state, true, false, false, false, amqp.Table{
			amqp.QueueTypeArg: amqp.QueueTypeQuorum, "x-delivery-limit": int64(math.MaxInt32), // as kill's state queues
		}); err != nil {
			return err
		}
		return ch.Publish("", state, false, false, amqp.Publishing{Body: []byte("command")})
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := 0
	b.ResetTimer()
	for range b.N {
		proxy, url := testenv.ProxyURL(b, env.URL)
		holder, err := amqp.Dial(url)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := statequeue.Lock(ctx, holder, lock); err != nil {
			b.Fatal(err)
		}
		ch, err := holder.Channel()
		if err != nil {
			b.Fatal(err)
		}
		if ds, err := statequeue.Get(ctx, ch, state, 1); err != nil || len(ds) != 1 {
			b.Fatalf("get: %d messages, %v", len(ds), err)
		}
		proxy.Drop()
		unlock := lockAtOnce(ctx, b, direct, lock)
		q := inspect(b, direct, state)
		if q.Consumers > 0 || q.Messages == 0 {
			out++
		}
		for q.Consumers > 0 || q.Messages == 0 {
			if ctx.Err() != nil {
				b.Fatal("the lost holder's message did not come back")
			}
			q = inspect(b, direct, state)
		}
		unlock()
		proxy.Close()
	}
	b.ReportMetric(float64(out)/float64(b.N), "out/op")
}

// lockAtOnce takes the lock as statequeue.Lock does, but tries again at once when it is held.
func lockAtOnce(ctx context.Context, b *testing.B, conn *amqp.Connection, lock string) (unlock func()) {
	for ctx.Err() == nil {
		ch, err := conn.Channel()
		if err != nil {
			b.Fatal(err)
		}
		_, err = ch.QueueDeclare(lock, false, true, false, false, amqp.Table{"x-expires": int32(time.Minute / time.Millisecond)})
		if err == nil {
			_, err = ch.Consume(lock, "", false, true, false, false, nil)
		}
		if err == nil {
			return func() { _ = ch.Close() }
		}
		_ = ch.Close()
	}
	b.Fatal("the lock was never free")
	return nil
}

func inspect(b *testing.B, conn *amqp.Connection, queue string) (q amqp.Queue) {
	err := statequeue.OnChannel(conn, func(ch *amqp.Channel) (err error) {
		q, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return q
}
