package router

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/topology"
)

// Action is what a kill command asks of every consumer of a queue.
type Action string

// The actions of the kill topic.
const (
	// Stop: stop taking messages, finish and ack those in flight, return the prefetched
	// ones to the queue, and wait for a Resume.
	Stop Action = "stop"
	// Delete: keep consuming until the queue is empty, then stop and delete the queue (only
	// if it is empty and unused: nothing is lost), its poison queue if empty and its kill
	// exchange if unused.
	Delete Action = "delete"
	// Resume lifts a Stop: consumers take messages again.
	Resume Action = "resume"
)

// Command is a message of the kill topic. Its signature, when a secret is configured, is an
// HMAC-SHA256 over queue, action and time. Consumers refuse a command that is for another
// queue, older than their KillMaxAge or dated ahead of their clock by more than their
// KillClockSkew; with a secret, also one that is unsigned, wrongly signed or older than the
// last one they accepted (a replay).
type Command struct {
	Queue  string    `json:"queue"`
	Action Action    `json:"action"`
	At     time.Time `json:"at"`
	Sig    string    `json:"sig,omitempty"`
}

func (c Command) mac(secret []byte) string {
	m := hmac.New(sha256.New, secret)
	fmt.Fprintf(m, "warren-kill\n%s\n%s\n%s", c.Queue, c.Action, c.At.UTC().Format(time.RFC3339Nano))
	return hex.EncodeToString(m.Sum(nil))
}

// Sign sets the command's signature.
func (c *Command) Sign(secret []byte) { c.Sig = c.mac(secret) }

// verify checks a received command against the consumer's queue, secret and clock (now):
// it must not be dated ahead of now by more than skew nor, unless maxAge is 0, be older
// than maxAge.
func (c Command) verify(queue string, secret []byte, now time.Time, maxAge, skew time.Duration) error {
	switch {
	case c.Queue != queue:
		return fmt.Errorf("command for queue %q, not %q", c.Queue, queue)
	case c.Action != Stop && c.Action != Delete && c.Action != Resume:
		return fmt.Errorf("unknown action %q", c.Action)
	case len(secret) > 0 && c.Sig == "":
		return errors.New("unsigned command")
	case len(secret) > 0 && !hmac.Equal([]byte(c.Sig), []byte(c.mac(secret))):
		return errors.New("wrong signature")
	case c.At.Sub(now) > skew:
		return fmt.Errorf("command of %s is dated %s ahead of this clock, more than KillClockSkew %s",
			c.At.Format(time.RFC3339Nano), c.At.Sub(now).Round(time.Millisecond), skew)
	case maxAge > 0 && now.Sub(c.At) > maxAge:
		return fmt.Errorf("command of %s is older than KillMaxAge %s", c.At.Format(time.RFC3339Nano), maxAge)
	}
	return nil
}

// KillStateQueue is the name of the queue that remembers the last kill command sent to the
// consumers of queue (topology.KillStateQueue). With a secret, the name carries an HMAC of
// the queue: RabbitMQ checks a publish against the exchange only, so any user who may
// publish to the default exchange (every warren application) can publish into a queue it
// can name, and read permission, which consumers need, is enough to purge it. Nobody
// without the secret can name this one.
func KillStateQueue(queue string, secret []byte) string {
	name := topology.KillStateQueue(queue)
	if len(secret) > 0 {
		m := hmac.New(sha256.New, secret)
		fmt.Fprintf(m, "warren-kill-state\n%s", queue)
		name += "." + hex.EncodeToString(m.Sum(nil))[:16]
	}
	return name
}

// stateArgs declare the kill state queue: durable (quorum), and short. A Killer purges it
// and publishes one command, but x-max-length 1 with reject-publish does not keep it to
// one (measured on RabbitMQ 3.10.8 and 4.0.5: a quorum queue refuses a publish only once
// it is over the limit, so two fit, and the messages a reader holds do not count): it only
// bounds what can be slipped in. Consumers therefore read several messages and take the
// newest. A refused command that is read is requeued, which counts as a delivery: the
// limit is the largest that means "unlimited" both on RabbitMQ 3.10 (where -1 drops a
// message after its first return) and 4.x.
var stateArgs = amqp.Table{
	amqp.QueueTypeArg:  amqp.QueueTypeQuorum,
	"x-max-length":     int64(1),
	"x-overflow":       "reject-publish",
	"x-delivery-limit": int64(math.MaxInt32),
}

// KillEvent tells what a consumer did about the kill topic.
type KillEvent struct {
	Queue   string
	Handler string
	// State: "stopped" (no longer taking messages, nothing in flight), "resumed",
	// "draining" (taking messages until the queue is empty), "deleted" (the queue is gone,
	// the consumer ended), or "refused" (a command that failed verification; Err says why).
	State string
	// Action of the command that caused it, received or, when the subscription started,
	// read from the kill state queue.
	Action Action
	At     time.Time
	Err    error
}

// KillerConfig configures a Killer. Its fields are named as in Config.
type KillerConfig struct {
	// Connection says how to reach the broker (URL required).
	Connection warren.Connection
	// KillSecret signs commands; consumers with a secret refuse unsigned ones.
	KillSecret []byte
	// PublishTimeout bounds each Kill and Resume, connecting and retries included. Default 30s.
	PublishTimeout time.Duration
}

// WithDefaults returns c with every unset field set to its default.
func (c KillerConfig) WithDefaults() KillerConfig {
	c.Connection = c.Connection.WithDefaults()
	if c.PublishTimeout == 0 {
		c.PublishTimeout = dlx.DefaultPublishTimeout
	}
	return c
}

// Validate reports the first field of c that is not usable. No error contains a password of
// KillerConfig.Connection.URL.
func (c KillerConfig) Validate() error {
	if err := c.Connection.Validate(); err != nil {
		return fmt.Errorf("router: KillerConfig.%w", err)
	}
	if c.PublishTimeout < 0 {
		return fmt.Errorf("router: KillerConfig.PublishTimeout %s is negative", c.PublishTimeout)
	}
	return nil
}

// Killer sends kill and resume commands to every consumer of a queue, in every process.
type Killer struct {
	cfg    KillerConfig
	logger watermill.LoggerAdapter
	dialer *amqpx.Dialer
}

// NewKiller returns a Killer, or an error naming the first invalid field of config.
func NewKiller(config KillerConfig, logger watermill.LoggerAdapter) (*Killer, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config = config.WithDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Killer{cfg: config, logger: logger, dialer: amqpx.NewDialer(config.Connection, "warren killer", logger)}, nil
}

// ErrNoListener is wrapped by the error of Kill and Resume when no consumer of the queue was
// listening: the command is remembered all the same, and consumers that start later obey
// it.
var ErrNoListener = errors.New("no consumer is listening")

// Kill makes every consumer of queue stop (Stop) or drain the queue and delete it (Delete).
// The kill is remembered: consumers that start later do not consume until Resume. If no
// consumer is listening, the error wraps ErrNoListener (the kill is remembered all the same).
func (k *Killer) Kill(ctx context.Context, queue string, action Action) error {
	if action != Stop && action != Delete {
		return fmt.Errorf("router: kill %s: action %q is neither %q nor %q", queue, action, Stop, Delete)
	}
	return k.send(ctx, queue, action)
}

// Resume lifts a Stop: the consumers of queue take messages again, and consumers that start
// later do too. If no consumer is listening, the error wraps ErrNoListener.
func (k *Killer) Resume(ctx context.Context, queue string) error {
	return k.send(ctx, queue, Resume)
}

// send writes the command into the kill state queue, then publishes it to the kill
// exchange: a consumer that starts listening after the publish finds it in the state.
func (k *Killer) send(ctx context.Context, queue string, action Action) error {
	what := fmt.Sprintf("router: %s %s", action, queue)
	heard := false
	err := amqpx.RetryLogged(ctx, k.cfg.PublishTimeout, what, k.logger, nil, func(ctx context.Context) error {
		var err error
		heard, err = k.deliver(ctx, queue, action)
		return amqpx.PermanentIfRefused(err)
	})
	if err == nil && !heard {
		return fmt.Errorf("%s: %w; the command is remembered for consumers that start later", what, ErrNoListener)
	}
	return err
}

// deliver is one attempt of send, on a connection of its own that ctx bounds: when ctx
// ends, the connection is closed under whatever waits. It reports whether the kill
// exchange routed the command to a listener.
func (k *Killer) deliver(ctx context.Context, queue string, action Action) (heard bool, err error) {
	conn, err := k.dialer.Dial(ctx)
	if err != nil {
		return false, err
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.CloseDeadline(time.Now()) })
	defer func() {
		if stop() { // ctx has not ended: close politely, within it
			dl, _ := ctx.Deadline()
			_ = conn.CloseDeadline(dl)
		}
	}()
	ch, err := conn.Channel()
	if err != nil {
		return false, err
	}
	if err := ch.Confirm(false); err != nil {
		return false, err
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	// publish publishes mandatorily and reports whether the broker took the message (ack)
	// and routed it (not returned: the return comes before the ack).
	publish := func(exchange, key string, body []byte, at time.Time) (acked, routed bool, err error) {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, amqp.Publishing{
			ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body, Timestamp: at,
		})
		if err != nil {
			return false, false, err
		}
		acked, err = dc.WaitContext(ctx)
		select {
		case <-returns:
			return acked, false, err
		default:
			return acked, true, err
		}
	}

	state, kill := KillStateQueue(queue, k.cfg.KillSecret), topology.KillExchange(queue)
	if err := ch.ExchangeDeclare(kill, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return false, err
	}
	unlock, err := lockState(ctx, conn, queue)
	if err != nil {
		return false, err
	}
	defer unlock()
	var body []byte
	var at time.Time
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		if _, err := ch.QueueDeclare(state, true, false, false, false, stateArgs); err != nil {
			return false, fmt.Errorf("declare %s: %w", state, err)
		}
		if _, err := ch.QueuePurge(state, false); err != nil {
			return false, err
		}
		// Dated now, after the connection is up: the command is as fresh as it can be.
		if body, at, err = k.command(queue, action); err != nil {
			return false, amqpx.Permanent(err)
		}
		acked, routed, err := publish("", state, body, at)
		if err != nil {
			return false, err
		}
		if acked && routed {
			break
		}
		// Refused (over its limit: messages were slipped in after the purge) or unrouted (the
		// queue was deleted meanwhile): again.
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	acked, routed, err := publish(kill, "", body, at)
	if err != nil {
		return false, err
	}
	if !acked {
		return false, fmt.Errorf("command not confirmed by the broker")
	}
	return routed, nil
}

// command returns a command for queue dated now, signed if there is a secret, and its JSON.
func (k *Killer) command(queue string, action Action) ([]byte, time.Time, error) {
	cmd := Command{Queue: queue, Action: action, At: time.Now().UTC()}
	if len(k.cfg.KillSecret) > 0 {
		cmd.Sign(k.cfg.KillSecret)
	}
	body, err := json.Marshal(cmd)
	return body, cmd.At, err
}
