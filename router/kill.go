package router

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
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
//
// A command published to the kill exchange may carry a reply address, in the AMQP
// properties reply_to (a server-named queue, "amq.gen-…") and correlation_id: each consumer
// that acts on it publishes an Answer there (see Killer.Send). With a secret, ReplySig signs
// the reply address together with the command (SignReply); it is kept apart from Sig, so
// that consumers of earlier warren versions, which ignore it, still verify Sig and obey.
type Command struct {
	Queue  string    `json:"queue"`
	Action Action    `json:"action"`
	At     time.Time `json:"at"`
	Sig    string    `json:"sig,omitempty"`
	// ReplySig is an HMAC-SHA256 over queue, action, time, reply_to and correlation_id.
	ReplySig string `json:"reply_sig,omitempty"`
}

func (c Command) mac(secret []byte) string {
	m := hmac.New(sha256.New, secret)
	fmt.Fprintf(m, "warren-kill\n%s\n%s\n%s", c.Queue, c.Action, c.At.UTC().Format(time.RFC3339Nano))
	return hex.EncodeToString(m.Sum(nil))
}

func (c Command) replyMAC(secret []byte, replyTo, correlationID string) string {
	m := hmac.New(sha256.New, secret)
	fmt.Fprintf(m, "warren-kill-reply\n%s\n%s\n%s\n%s\n%s", c.Queue, c.Action, c.At.UTC().Format(time.RFC3339Nano),
		replyTo, correlationID)
	return hex.EncodeToString(m.Sum(nil))
}

// Sign sets the command's signature.
func (c *Command) Sign(secret []byte) { c.Sig = c.mac(secret) }

// SignReply sets the signature of the reply address the command is published with (the
// AMQP properties reply_to and correlation_id).
func (c *Command) SignReply(secret []byte, replyTo, correlationID string) {
	c.ReplySig = c.replyMAC(secret, replyTo, correlationID)
}

// verifyReply checks, for a consumer with a secret, that the reply address a command came
// with is the one its sender signed.
func (c Command) verifyReply(secret []byte, replyTo, correlationID string) error {
	switch {
	case c.ReplySig == "":
		return errors.New("unsigned reply address")
	case !hmac.Equal([]byte(c.ReplySig), []byte(c.replyMAC(secret, replyTo, correlationID))):
		return errors.New("wrong reply address signature")
	}
	return nil
}

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
	// KillSecret signs commands; consumers with a secret refuse unsigned ones. It also
	// signs the reply address, and answers that confirm a command are counted only when
	// signed with it (see Answer).
	KillSecret []byte
	// PublishTimeout bounds each Kill and Resume, connecting and retries included, but not
	// Wait. Default 30s. Connecting alone is also bounded by Connection.ConnectTimeout.
	PublishTimeout time.Duration
	// Wait is how long Send, Kill and Resume wait for the consumers to confirm the command
	// (see Send), after it was sent. 0, the default, asks for no confirmation.
	Wait time.Duration
	// Force sends commands for a queue that does not exist (yet): they are remembered, and
	// consumers that start later obey them. Without it, a command for a queue that does not
	// exist fails with ErrNoQueue, and nothing is declared.
	Force bool
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
	if c.Wait < 0 {
		return fmt.Errorf("router: KillerConfig.Wait %s is negative", c.Wait)
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

// ErrNoQueue is wrapped by the error of Send, Kill and Resume when the queue does not exist
// (and KillerConfig.Force is not set): nothing was declared and nothing was sent.
var ErrNoQueue = errors.New("no such queue")

// Kill makes every consumer of queue stop (Stop) or drain the queue and delete it (Delete).
// The kill is remembered: consumers that start later do not consume until Resume. If no
// consumer is listening, the error wraps ErrNoListener (the kill is remembered all the same);
// if the queue does not exist, ErrNoQueue (unless KillerConfig.Force). It is Send without
// the Result.
func (k *Killer) Kill(ctx context.Context, queue string, action Action) error {
	if action != Stop && action != Delete {
		return fmt.Errorf("router: kill %s: action %q is neither %q nor %q", queue, action, Stop, Delete)
	}
	_, err := k.Send(ctx, queue, action)
	return err
}

// Resume lifts a Stop: the consumers of queue take messages again, and consumers that start
// later do too. If no consumer is listening, the error wraps ErrNoListener; if the queue does
// not exist, ErrNoQueue (unless KillerConfig.Force). It is Send without the Result.
func (k *Killer) Resume(ctx context.Context, queue string) error {
	_, err := k.Send(ctx, queue, Resume)
	return err
}

// Result is what came of a command: what the queue looked like when it was sent, and the
// consumers' confirmations.
type Result struct {
	Queue  string `json:"queue"`
	Action Action `json:"action"`
	// QueueExists: the queue existed when the command was sent (it may not with
	// KillerConfig.Force).
	QueueExists bool `json:"queue_exists"`
	// QueueConsumers is how many consumers the queue had when the command was sent (its
	// consumer_count): each consuming warren subscription has one, a stopped one none, and
	// consumers that are not warren's (which do not obey commands) count too.
	QueueConsumers int `json:"queue_consumers"`
	// Heard: the command reached at least one consumer (else the error wraps ErrNoListener).
	Heard bool `json:"heard"`
	// Waited is how long confirmations were waited for: 0 without KillerConfig.Wait, less
	// than Wait when as many consumers as the queue had answered. In JSON waited_ms, in
	// milliseconds (see MarshalJSON).
	Waited time.Duration `json:"-"`
	// Consumers is how many consumers (subscriptions) confirmed the command, in how many
	// Processes.
	Consumers int `json:"consumers"`
	Processes int `json:"processes"`
	// States counts the confirmations by the consumer's state: "stopped", "draining",
	// "resumed".
	States map[string]int `json:"states"`
	// Refused is how many consumers refused the command (their Answer says why).
	Refused int `json:"refused"`
	// Ignored counts the answers that were not counted: malformed, for another command, a
	// consumer's second answer, or, with a KillSecret, a confirmation not signed with it.
	Ignored int `json:"ignored"`
	// Answers lists the answers counted, in the order they came.
	Answers []Answer `json:"answers"`
}

// Confirmed reports whether the command is known to be in force everywhere: nobody refused
// it, and either nobody heard it (it is remembered for the consumers that start) or every
// consumer the queue had confirmed it (at least one, when the queue had none: stopped
// consumers have none). Without KillerConfig.Wait, nothing is confirmed.
func (r Result) Confirmed() bool {
	switch {
	case !r.Heard:
		return true
	case r.Refused > 0 || r.Consumers == 0:
		return false
	}
	return r.consuming() >= r.QueueConsumers
}

// consuming counts the confirmations of the consumers that were consuming the queue.
func (r Result) consuming() int {
	n := 0
	for _, a := range r.Answers {
		if a.State != refused && a.Consuming {
			n++
		}
	}
	return n
}

// refused is the state of an Answer to a command that failed verification.
const refused = "refused"

// Answer is what a consumer (a subscription of a Subscriber) publishes to the reply address
// of a live command it acted on: once it is in the state the command asks for ("stopped",
// once nothing is in flight any more; "draining"; "resumed", also when it was in that state
// already), or "refused", with the reason. Commands read from the kill state queue (when a
// consumer starts or reconnects) are never answered.
//
// Answers are published fire and forget (not mandatory, not confirmed, on a channel of
// their own, from a goroutine of their own): a consumer never waits or fails because of one.
// They go only to a server-named queue ("amq.gen-…", a name no client can choose, so never a
// work queue). With a KillSecret, a consumer answers a command it obeyed only if the reply
// address is signed (Command.ReplySig: else anyone who saw a command go past could redirect
// copies of it), and signs its answer (Sig), which a Killer with the secret requires of
// confirmations: an answer can be forged by anyone who may publish to the default exchange
// and saw the reply address go past. A refusal is answered without the consumer's identity
// when the reply address is not signed, and counted unsigned: it can only make a command
// look less successful.
type Answer struct {
	Queue   string `json:"queue"`
	Handler string `json:"handler,omitempty"`
	State   string `json:"state"`
	// Consuming: the consumer had a consumer on the queue when the command came (it was not
	// stopped).
	Consuming bool   `json:"consuming"`
	Host      string `json:"host,omitempty"`
	PID       int    `json:"pid,omitempty"`
	// Process is a random id of the consumer's process, Instance one of the subscription.
	Process  string `json:"process,omitempty"`
	Instance string `json:"instance,omitempty"`
	Error    string `json:"error,omitempty"`
	Sig      string `json:"sig,omitempty"`
}

func (a Answer) mac(secret []byte, correlationID string) string {
	m := hmac.New(sha256.New, secret)
	fmt.Fprintf(m, "warren-kill-answer\n%s\n%s\n%s\n%s\n%t\n%s\n%d\n%s\n%s\n%s", correlationID, a.Queue, a.Handler, a.State,
		a.Consuming, a.Host, a.PID, a.Process, a.Instance, a.Error)
	return hex.EncodeToString(m.Sum(nil))
}

// replyTimeout bounds a consumer's publish of an Answer.
const replyTimeout = 5 * time.Second

// Send sends action (Stop, Delete or Resume) to every consumer of queue, in every process,
// and returns what came of it. It first checks that the queue exists (a passive declare,
// which also counts its consumers): if not, and KillerConfig.Force is not set, it fails with
// ErrNoQueue before anything is declared. It then writes the command into the kill state
// queue and publishes it to the kill exchange. If no consumer is listening, the error wraps
// ErrNoListener (the command is remembered all the same).
//
// With KillerConfig.Wait, the command carries a reply address (an exclusive, auto-delete,
// server-named queue of the Killer's connection, and a correlation id of its own), and Send
// collects the consumers' answers (see Answer) until Wait is over, or until as many
// consumers as the queue had when the command was sent have answered, or until ctx ends (the
// command was sent all the same). There is no way to count the consumers that are stopped
// (they have no consumer on the queue): a Resume of a stopped queue waits for all of Wait.
func (k *Killer) Send(ctx context.Context, queue string, action Action) (Result, error) {
	res := Result{Queue: queue, Action: action, States: map[string]int{}}
	what := fmt.Sprintf("router: %s %s", action, queue)
	if action != Stop && action != Delete && action != Resume {
		return res, fmt.Errorf("%s: unknown action %q", what, action)
	}
	var out *sent
	err := amqpx.RetryLogged(ctx, k.cfg.PublishTimeout, what, k.logger, nil, func(ctx context.Context) error {
		var err error
		out, err = k.deliver(ctx, queue, action, &res)
		return amqpx.PermanentIfRefused(err)
	})
	if err != nil {
		return res, err
	}
	defer out.close()
	res.Heard = out.heard
	if !out.heard {
		return res, fmt.Errorf("%s: %w; the command is remembered for consumers that start later", what, ErrNoListener)
	}
	if out.replies != nil {
		k.collect(ctx, out, &res)
	}
	return res, nil
}

// sent is a command sent by deliver: whether a listener heard it, and, when confirmations
// are waited for, the connection that holds its reply queue and the answers that arrive.
type sent struct {
	heard         bool
	conn          *amqp.Connection
	replies       <-chan amqp.Delivery
	replyTo       string
	correlationID string
	at            time.Time // when it was published
}

func (s *sent) close() {
	if s.conn != nil {
		_ = amqpx.Close(s.conn)
	}
}

// deliver is one attempt of Send, on a connection of its own that ctx bounds: when ctx
// ends, the connection is closed under whatever waits. It checks that the queue exists
// (recording what it found in res), writes the command into the kill state queue, then
// publishes it to the kill exchange: a consumer that starts listening after the publish
// finds it in the state. With KillerConfig.Wait, it leaves the connection open, with a reply
// queue consumed, for the caller to collect the answers and close.
func (k *Killer) deliver(ctx context.Context, queue string, action Action, res *Result) (out *sent, err error) {
	conn, err := k.dialer.ConnectWithin(ctx, k.cfg.PublishTimeout)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.CloseDeadline(time.Now()) })
	defer func() {
		if !stop() { // ctx has ended: the connection is closed
			return
		}
		if err != nil || out.replies == nil {
			dl, _ := ctx.Deadline() // close politely, within ctx
			_ = conn.CloseDeadline(dl)
			if out != nil {
				out.conn = nil
			}
		}
	}()

	// On a channel of its own: a passive declare of a queue that does not exist closes it.
	err = onChannel(conn, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		res.QueueExists, res.QueueConsumers = err == nil, q.Consumers
		return err
	})
	switch {
	case amqpx.IsNotFound(err):
		if !k.cfg.Force {
			return nil, amqpx.Permanent(fmt.Errorf("%w (nothing was declared or sent)", ErrNoQueue))
		}
	case err != nil:
		return nil, fmt.Errorf("check %s: %w", queue, err)
	}

	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	// publish publishes mandatorily and reports whether the broker took the message (ack)
	// and routed it (not returned: the return comes before the ack).
	publish := func(exchange, key string, p amqp.Publishing) (acked, routed bool, err error) {
		p.ContentType, p.DeliveryMode = "application/json", amqp.Persistent
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, true, false, p)
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

	out = &sent{conn: conn}
	if k.cfg.Wait > 0 { // consumed before the command goes out: no answer comes before
		q, err := ch.QueueDeclare("", false, true, true, false, nil)
		if err != nil {
			return nil, fmt.Errorf("declare a reply queue: %w", err)
		}
		if out.replies, err = ch.Consume(q.Name, "", true, true, false, false, nil); err != nil {
			return nil, fmt.Errorf("consume the reply queue: %w", err)
		}
		out.replyTo, out.correlationID = q.Name, newID()
	}

	state, kill := KillStateQueue(queue, k.cfg.KillSecret), topology.KillExchange(queue)
	if err := ch.ExchangeDeclare(kill, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return nil, err
	}
	unlock, err := lockState(ctx, conn, queue)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var cmd Command
	var body []byte
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		if _, err := ch.QueueDeclare(state, true, false, false, false, stateArgs); err != nil {
			return nil, fmt.Errorf("declare %s: %w", state, err)
		}
		if _, err := ch.QueuePurge(state, false); err != nil {
			return nil, err
		}
		// Dated now, after the connection is up: the command is as fresh as it can be. The
		// state's copy carries no reply address: it is never answered.
		cmd = k.command(queue, action)
		if body, err = json.Marshal(cmd); err != nil {
			return nil, amqpx.Permanent(err)
		}
		acked, routed, err := publish("", state, amqp.Publishing{Body: body, Timestamp: cmd.At})
		if err != nil {
			return nil, err
		}
		if acked && routed {
			break
		}
		// Refused (over its limit: messages were slipped in after the purge) or unrouted (the
		// queue was deleted meanwhile): again.
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	live := amqp.Publishing{Body: body, Timestamp: cmd.At}
	if out.replies != nil {
		if len(k.cfg.KillSecret) > 0 {
			cmd.SignReply(k.cfg.KillSecret, out.replyTo, out.correlationID)
		}
		if live.Body, err = json.Marshal(cmd); err != nil {
			return nil, amqpx.Permanent(err)
		}
		live.ReplyTo, live.CorrelationId = out.replyTo, out.correlationID
	}
	acked, routed, err := publish(kill, "", live)
	if err != nil {
		return nil, err
	}
	if !acked {
		return nil, fmt.Errorf("command not confirmed by the broker")
	}
	out.heard, out.at = routed, time.Now()
	return out, nil
}

// command returns a command for queue dated now, signed if there is a secret.
func (k *Killer) command(queue string, action Action) Command {
	cmd := Command{Queue: queue, Action: action, At: time.Now().UTC()}
	if len(k.cfg.KillSecret) > 0 {
		cmd.Sign(k.cfg.KillSecret)
	}
	return cmd
}

// collect counts the answers to the command out into res, until KillerConfig.Wait is over,
// ctx ends, or as many consumers as the queue had when the command was sent have answered.
func (k *Killer) collect(ctx context.Context, out *sent, res *Result) {
	timer := time.NewTimer(k.cfg.Wait - time.Since(out.at))
	defer timer.Stop()
	defer func() { res.Waited = time.Since(out.at) }()
	instances, processes := map[string]bool{}, map[string]bool{}
	answered := 0 // consumers that were consuming the queue, and answered
	for answered < res.QueueConsumers || res.QueueConsumers == 0 {
		var d amqp.Delivery
		var ok bool
		select {
		case d, ok = <-out.replies:
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
		if !ok {
			k.logger.Error("Lost the reply queue: confirmations no longer counted", nil,
				watermill.LogFields{"queue": res.Queue, "action": res.Action})
			return
		}
		var a Answer
		err := json.Unmarshal(d.Body, &a)
		switch {
		case err != nil:
		case d.CorrelationId != out.correlationID:
			err = fmt.Errorf("correlation id %q is not this command's", d.CorrelationId)
		case a.Queue != res.Queue:
			err = fmt.Errorf("answer for queue %q", a.Queue)
		case a.Instance != "" && instances[a.Instance]:
			err = fmt.Errorf("second answer of consumer %s", a.Instance)
		case a.State == refused:
		case a.State != "stopped" && a.State != "draining" && a.State != "resumed":
			err = fmt.Errorf("unknown state %q", a.State)
		case len(k.cfg.KillSecret) > 0 && !hmac.Equal([]byte(a.Sig), []byte(a.mac(k.cfg.KillSecret, d.CorrelationId))):
			err = errors.New("a confirmation not signed with the KillSecret")
		}
		if err != nil {
			res.Ignored++
			k.logger.Debug("Kill answer ignored", watermill.LogFields{"queue": res.Queue, "err": err.Error()})
			continue
		}
		if a.Instance != "" {
			instances[a.Instance] = true
		}
		res.Answers = append(res.Answers, a)
		if a.Consuming {
			answered++
		}
		if a.State == refused {
			res.Refused++
			continue
		}
		res.Consumers++
		res.States[a.State]++
		if a.Process != "" && !processes[a.Process] {
			processes[a.Process] = true
			res.Processes++
		}
	}
}

// newID returns a random id of 16 hex digits.
func newID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
