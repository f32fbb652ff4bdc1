// Package amqpx is warren's shared plumbing for talking to RabbitMQ: every call to the broker
// goes through Retry (cenkalti/backoff/v4 with a time limit), connections are opened by Dial,
// and channel operations that have no context of their own are bounded by Do.
package amqpx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Permanent marks err as not worth retrying: Retry returns it at once.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return backoff.Permanent(err)
}

// Retry runs op until it succeeds, returns a Permanent error, ctx ends or limit has elapsed.
// Transient failures are retried with exponential backoff. When the limit is reached the
// returned error says what was attempted, for how long, and wraps the last failure.
func Retry(ctx context.Context, limit time.Duration, what string, op func(ctx context.Context) error) error {
	if limit <= 0 {
		return fmt.Errorf("%s: time limit %s is not positive", what, limit)
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()

	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 50 * time.Millisecond
	b.MaxInterval = 2 * time.Second
	b.MaxElapsedTime = limit

	var last error
	err := backoff.Retry(func() error {
		last = op(ctx)
		return last
	}, backoff.WithContext(b, ctx))
	if err == nil {
		return nil
	}
	var perm *backoff.PermanentError
	if errors.As(last, &perm) {
		return fmt.Errorf("%s: %w", what, perm.Err)
	}
	if last == nil {
		last = err
	}
	if ctx.Err() == context.Canceled {
		return fmt.Errorf("%s: canceled: %w", what, last)
	}
	return fmt.Errorf("%s: gave up after %s: %w", what, limit, last)
}

// Dial opens a connection to url. The TCP connect and the AMQP handshake are each bounded by
// timeout; name is shown in the broker's connection list.
func Dial(url, name string, timeout time.Duration) (*amqp.Connection, error) {
	props := amqp.NewConnectionProperties()
	props.SetClientConnectionName(name)
	return amqp.DialConfig(url, amqp.Config{
		Heartbeat:  10 * time.Second,
		Locale:     "en_US",
		Properties: props,
		Dial: func(network, addr string) (net.Conn, error) {
			conn, err := net.DialTimeout(network, addr, timeout)
			if err != nil {
				return nil, err
			}
			// Cleared by amqp091 once the handshake is complete.
			return conn, conn.SetDeadline(time.Now().Add(timeout))
		},
	})
}

// Do runs op, which uses ch, and returns its error. If ctx ends first, ch is closed (which
// makes op return) and the context's error is returned: a broker that does not answer can
// never hang the caller.
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
		_ = ch.Close()
		<-done
		return ctx.Err()
	}
}

// PermanentIfRefused marks err Permanent when it is a broker refusal that retrying cannot
// change (see IsPermanentBrokerError), and returns it unchanged otherwise.
func PermanentIfRefused(err error) error {
	if IsPermanentBrokerError(err) {
		return Permanent(err)
	}
	return err
}

// IsPermanentBrokerError reports whether err is a broker reply that retrying cannot change
// (access refused, precondition failed, not found, ...), as opposed to a lost connection.
// A durable queue reported absent ("home node ... is down or inaccessible") is not
// permanent: in a cluster its node may come back, and on a single node RabbitMQ (3.x)
// gives that reply for a moment while another connection declares or deletes the same
// queue (it reads its two queue tables outside a transaction). Seen in CI when parallel
// publishers declared the same delay levels at once.
func IsPermanentBrokerError(err error) bool {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return false
	}
	if ae.Code == amqp.NotFound && strings.Contains(ae.Reason, "is down or inaccessible") {
		return false
	}
	switch ae.Code {
	case amqp.AccessRefused, amqp.PreconditionFailed, amqp.NotFound, amqp.ResourceLocked,
		amqp.NotAllowed, amqp.NotImplemented, amqp.SyntaxError, amqp.CommandInvalid, amqp.InvalidPath:
		return true
	}
	return false
}
