package dlx

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
)

// ErrNacked is wrapped by the error of a publishing the broker nacked.
var ErrNacked = amqpx.ErrNacked

// ReturnedError is the error of a mandatory publishing the broker could not route: its
// fields Exchange and RoutingKey say where it went, ReplyCode and ReplyText why the broker
// returned it.
type ReturnedError = amqpx.ReturnedError

// isPermanent reports whether a Publish error is one that publishing again cannot cure: a
// message too large or with invalid delay metadata, a message the broker returned (no queue
// takes it) or a refusal by the broker (access refused, a missing exchange). Publish marks
// these warren.Permanent. Other errors (a lost connection, a nack, the time limit) may pass.
func isPermanent(err error) bool {
	return errors.Is(err, warren.ErrTooLarge) || errors.Is(err, warren.ErrInvalidDelay) || errors.Is(err, warren.ErrNoOrderKey) || isReturned(err) ||
		amqpx.IsPermanentBrokerError(err)
}

// isReturned reports whether err is a *ReturnedError.
func isReturned(err error) bool {
	var ret *ReturnedError
	return errors.As(err, &ret)
}

// publishAll sends every message not yet confirmed, then waits for all of them. A return is
// final; a nack and a closed channel are retried by the caller. A broker refusal that closes
// the channel (access refused, a message size over the broker's limit) cannot be told apart
// from the messages in flight with it: those are marked suspect and sent alone next time.
func (p *Publisher) publishAll(ctx context.Context, conf *amqpx.Confirmer, route Route, out []outgoing) error {
	var sendErr error
	sent := out[:0:0] // no message in flight yet
	for i := range out {
		o := &out[i]
		if o.confirmed {
			continue
		}
		exchange, key, pub, err := p.prepare(route, *o)
		if err != nil {
			sendErr = amqpx.GiveUp(err)
			break
		}
		if o.flight, err = conf.Publish(ctx, exchange, key, !p.cfg.AllowUnroutable, pub); err != nil {
			o.suspect = amqpx.IsPermanentBrokerError(err)
			sendErr = err
			break
		}
		sent = out[:i+1]
	}
	var final error
	for i := range sent {
		o := &sent[i]
		if o.confirmed {
			continue
		}
		err := o.flight.Wait(ctx)
		o.flight = amqpx.Inflight{}
		switch {
		case err == nil:
			o.confirmed = true
		case isReturned(err):
			if final == nil {
				final = amqpx.GiveUp(fmt.Errorf("message %s: %w", o.pub.MessageId, err))
			}
		case errors.Is(err, ErrNacked):
			// Published again after a backoff, until the time limit, on a fresh channel: the
			// broker did not take it (a full queue that rejects publishes, a quorum queue
			// without a leader for a moment), and RabbitMQ 3.10 goes on nacking on a channel
			// that published while the queue had no leader.
			p.retire(conf)
			if sendErr == nil {
				sendErr = fmt.Errorf("message %s: %w (%s)", o.pub.MessageId, err, nackHint(route))
			}
		default:
			o.suspect = amqpx.IsPermanentBrokerError(err)
			if sendErr == nil {
				sendErr = err
			}
		}
	}
	if final != nil {
		return final
	}
	return sendErr
}

// nackHint says what a nack of a publish to route can mean: basic.nack carries no reason.
func nackHint(route Route) string {
	to := fmt.Sprintf("exchange %q, routing key %q", route.Exchange, route.RoutingKey)
	if route.Exchange == "" {
		to = fmt.Sprintf("queue %q", route.RoutingKey)
	}
	return "a nack gives no reason: a queue it was routed to (" + to + ", or a delay level) took none; it may be " +
		"down (a quorum queue without a leader; see `warren status --management`) or full and rejecting publishes"
}

// publishAlone publishes o on a confirm channel of its own, so that a broker refusal that
// closes the channel is this message's own: it is then a permanent error.
func (p *Publisher) publishAlone(ctx context.Context, route Route, o outgoing) error {
	exchange, key, pub, err := p.prepare(route, o)
	if err != nil {
		return amqpx.GiveUp(err)
	}
	return p.withDeclareChannel(ctx, func(ch *amqp.Channel) error {
		conf, err := amqpx.NewConfirmer(ch)
		if err != nil {
			return err
		}
		f, err := conf.Publish(ctx, exchange, key, !p.cfg.AllowUnroutable, pub)
		if err == nil {
			err = f.Wait(ctx)
		}
		if isPermanent(err) {
			return amqpx.GiveUp(fmt.Errorf("message %s: %w", pub.MessageId, err))
		}
		return err
	})
}
