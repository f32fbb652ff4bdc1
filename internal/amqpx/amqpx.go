// Package amqpx is warren's shared plumbing for talking to RabbitMQ: every call to the broker
// goes through Retry (cenkalti/backoff/v4 with a time limit), every component's connections
// are opened by a Dialer (which reports them) and held by Reconnect or a Conn, and the calls
// that have no context of their own are bounded by Watch and Do (this file).
package amqpx

import (
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// CloseTimeout bounds Close.
const CloseTimeout = 5 * time.Second

// Close closes conn, waiting for the broker's answer no longer than CloseTimeout (a broker
// that no longer answers would hold amqp091's Close until the heartbeats time out).
func Close(conn *amqp.Connection) error {
	if conn == nil || conn.IsClosed() {
		return nil
	}
	return conn.CloseDeadline(time.Now().Add(CloseTimeout))
}

// watchGrace is how long Watch lets a call that ctx ended return by itself.
const watchGrace = 100 * time.Millisecond

// Watch makes the calls on conn until stop keep ctx's limit: amqp091's channel calls
// (opening and closing a channel, declaring, Do's closing of the channel) have no deadline
// of their own and block while the broker does not answer. If ctx ends and stop has not
// been called 100ms later, the broker is taken for gone and conn is closed, which ends every
// call blocked on it. stop must be called once.
func Watch(ctx context.Context, conn *amqp.Connection) (stop func()) {
	done := make(chan struct{})
	stopWatch := context.AfterFunc(ctx, func() {
		select {
		case <-done:
		case <-time.After(watchGrace):
			_ = conn.CloseDeadline(time.Now())
		}
	})
	return func() {
		close(done)
		stopWatch()
	}
}

// Do runs op, which makes one call on ch that waits for the broker, and returns its error.
// If ctx ends first and op has not returned a moment later (watchGrace), ch is closed (which
// makes op return) and the context's error is returned: a broker that does not answer can
// never hang the caller. One call only: amqp091-go hands the channel's close-ok to whichever
// call waits, so a second call sent after the close could take it and leave Close waiting
// for ever.
func Do(ctx context.Context, ch *amqp.Channel, op func() error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- op() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	select {
	case err := <-done:
		return err
	case <-time.After(watchGrace):
		_ = ch.Close()
		opErr := <-done
		_ = opErr // it failed because of the close: ctx's error says why
		return ctx.Err()
	}
}

// DeclareCounter declares name, a queue whose consumer count (a passive declare's) counts
// who holds a consumer on it, such as the kill listeners of a work queue or the processes
// that share an ordered queue's lanes: classic, the only type that can be auto-deleted
// (durable: the broker deprecates transient non-exclusive queues), and refusing every message
// (a length limit of 0 with reject-publish, on RabbitMQ 3.10.8 and 4.0.5 alike: nothing is
// stored or delivered), so that nobody can make it hold or hand out anything.
func DeclareCounter(ch *amqp.Channel, name string) error {
	_, err := ch.QueueDeclare(name, true, true, false, false, counterArgs)
	return err
}

var counterArgs = amqp.Table{"x-queue-type": "classic", "x-max-length": int32(0), "x-overflow": "reject-publish"}
