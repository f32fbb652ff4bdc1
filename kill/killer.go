package kill

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/statequeue"
	"github.com/warrenmq/warren/topology"
)

// Config configures a Killer.
type Config struct {
	// Connection says how to reach the broker (URL required).
	Connection warren.Connection
	// Secret signs commands; consumers with a secret (consumer.Config.KillSecret)
	// refuse unsigned ones. It also signs the reply address, and answers that confirm a
	// command are counted only when signed with it (see Answer). It names the state queue
	// too (see StateQueue).
	Secret []byte
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

// DefaultPublishTimeout is Config.PublishTimeout's default.
const DefaultPublishTimeout = 30 * time.Second

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	c.Connection = c.Connection.WithDefaults()
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	return c
}

// Validate reports the first field of c that is not usable. No error contains a password of
// Config.Connection.URL.
func (c Config) Validate() error {
	if err := c.Connection.Validate(); err != nil {
		return fmt.Errorf("kill: Config.%w", err)
	}
	if c.PublishTimeout < 0 {
		return fmt.Errorf("kill: Config.PublishTimeout %s is negative", c.PublishTimeout)
	}
	if c.Wait < 0 {
		return fmt.Errorf("kill: Config.Wait %s is negative", c.Wait)
	}
	return nil
}

// Killer sends kill and resume commands to every consumer of a queue, in every process.
type Killer struct {
	cfg    Config
	logger watermill.LoggerAdapter
	dialer *amqpx.Dialer

	mu   sync.Mutex
	last time.Time // the newest date this Killer gave a command
}

// NewKiller returns a Killer, or an error naming the first invalid field of config.
func NewKiller(config Config, logger watermill.LoggerAdapter) (*Killer, error) {
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
// (and Config.Force is not set): nothing was declared and nothing was sent.
var ErrNoQueue = errors.New("no such queue")

// Kill makes every consumer of queue stop (Stop) or drain the queue and delete it (Delete).
// The kill is remembered: consumers that start later do not consume until Resume. If no
// consumer is listening, the error wraps ErrNoListener (the kill is remembered all the same);
// if the queue does not exist, ErrNoQueue (unless Config.Force). It is Send without
// the Result.
func (k *Killer) Kill(ctx context.Context, queue string, action Action) error {
	if action != Stop && action != Delete {
		return fmt.Errorf("kill: kill %s: action %q is neither %q nor %q", queue, action, Stop, Delete)
	}
	_, err := k.Send(ctx, queue, action)
	return err
}

// Resume lifts a Stop: the consumers of queue take messages again, and consumers that start
// later do too. If no consumer is listening, the error wraps ErrNoListener; if the queue does
// not exist, ErrNoQueue (unless Config.Force). It is Send without the Result.
func (k *Killer) Resume(ctx context.Context, queue string) error {
	_, err := k.Send(ctx, queue, Resume)
	return err
}

// Send sends action (Stop, Delete or Resume) to every consumer of queue, in every process,
// and returns what came of it. It first checks that the queue exists (a passive declare,
// which also counts its consumers): if not, and Config.Force is not set, it fails with
// ErrNoQueue before anything is declared. It then writes the command into the kill state
// queue and publishes it to the kill exchange. If no consumer is listening, the error wraps
// ErrNoListener (the command is remembered all the same).
//
// With Config.Wait, the command carries a reply address (an exclusive, auto-delete,
// server-named queue of the Killer's connection, and a correlation id of its own), and Send
// collects the consumers' answers (see Answer) until every consumer the broker counted when
// the command was sent has answered: as many consuming ones as the queue had consumers
// (Result.QueueConsumers) and as many in all as listened to the kill topic
// (Result.Listeners, stopped ones too). It stops earlier when Wait is over or ctx ends (the
// command was sent all the same). When the broker counted none (consumers of an earlier
// warren version are not counted as listeners), it waits for all of Wait.
func (k *Killer) Send(ctx context.Context, queue string, action Action) (Result, error) {
	res := Result{Queue: queue, Action: action, States: map[string]int{}}
	what := fmt.Sprintf("kill: %s %s", action, queue)
	if action != Stop && action != Delete && action != Resume {
		return res, fmt.Errorf("%s: unknown action %q", what, action)
	}
	var out *sent
	err := amqpx.RetryLogged(ctx, k.cfg.PublishTimeout, what, k.logger, nil, func(ctx context.Context) error {
		var err error
		out, err = k.deliver(ctx, queue, action, &res)
		return amqpx.GiveUpIfRefused(err)
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
// finds it in the state. With Config.Wait, it leaves the connection open, with a reply
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
	if err := k.checkQueue(conn, queue, res); err != nil {
		return nil, err
	}
	k.countListeners(conn, queue, res)

	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	confirmer, err := amqpx.NewConfirmer(ch)
	if err != nil {
		return nil, err
	}
	publish := confirmedPublish(ctx, confirmer)
	out = &sent{conn: conn}
	if k.cfg.Wait > 0 { // consumed before the command goes out: no answer comes before
		if err := out.listen(ch); err != nil {
			return nil, err
		}
	}
	exchange := topology.KillExchange(queue)
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
		return nil, err
	}
	unlock, err := statequeue.Lock(ctx, conn, LockQueue(queue))
	if err != nil {
		return nil, err
	}
	defer unlock()
	cmd, body, err := k.writeState(ctx, ch, publish, queue, action)
	if err != nil {
		return nil, err
	}
	if err := k.announce(publish, exchange, cmd, body, out); err != nil {
		return nil, err
	}
	return out, nil
}

// checkQueue checks that queue exists, recording what it found in res: a queue that does not
// exist is a permanent ErrNoQueue unless Config.Force. On a channel of its own: a passive
// declare of a queue that does not exist closes it.
func (k *Killer) checkQueue(conn *amqp.Connection, queue string, res *Result) error {
	err := statequeue.OnChannel(conn, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		res.QueueExists, res.QueueConsumers = err == nil, q.Consumers
		return err
	})
	switch {
	case amqpx.IsNotFound(err):
		if !k.cfg.Force {
			return amqpx.GiveUp(fmt.Errorf("%w (nothing was declared or sent)", ErrNoQueue))
		}
	case err != nil:
		return fmt.Errorf("check %s: %w", queue, err)
	}
	return nil
}

// countListeners records in res how many subscriptions listen to the kill commands of queue.
// Counted before the command goes out: every subscription counted listens already, and
// hears it. Best effort: none counted (no listener queue: no subscription, or only those of
// an earlier warren) only makes Send wait for all of Wait.
func (k *Killer) countListeners(conn *amqp.Connection, queue string, res *Result) {
	err := statequeue.OnChannel(conn, func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(ListenerQueue(queue), true, true, false, false, nil)
		res.Listeners = q.Consumers
		return err
	})
	if err != nil && !amqpx.IsNotFound(err) {
		k.logger.Debug("Kill listeners not counted", watermill.LogFields{"queue": queue, "err": err.Error()})
	}
}

// publishFunc publishes p mandatorily and waits for the broker: nil once it took (acked)
// and routed it, amqpx.ErrNacked, or *amqpx.ReturnedError when nothing was bound.
type publishFunc func(exchange, key string, p amqp.Publishing) error

// confirmedPublish is the publishFunc of confirmer, within ctx; it publishes JSON,
// persistent.
func confirmedPublish(ctx context.Context, confirmer *amqpx.Confirmer) publishFunc {
	return func(exchange, key string, p amqp.Publishing) error {
		p.ContentType, p.DeliveryMode = "application/json", amqp.Persistent
		f, err := confirmer.Publish(ctx, exchange, key, true, p)
		if err != nil {
			return err
		}
		return f.Wait(ctx)
	}
}

// listen declares a reply queue on ch (exclusive, auto-delete, server-named) and consumes
// it, for the answers to the command s is; it gives s its reply address.
func (s *sent) listen(ch *amqp.Channel) error {
	q, err := ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		return fmt.Errorf("declare a reply queue: %w", err)
	}
	if s.replies, err = ch.Consume(q.Name, "", true, true, false, false, nil); err != nil {
		return fmt.Errorf("consume the reply queue: %w", err)
	}
	s.replyTo, s.correlationID = q.Name, statequeue.NewID()
	return nil
}

// writeState makes a command for queue the only one ready in its kill state queue, and
// returns the command and its body. Call it holding the state's lock.
func (k *Killer) writeState(ctx context.Context, ch *amqp.Channel, publish publishFunc, queue string, action Action) (Command, []byte, error) {
	state := StateQueue(queue, k.cfg.Secret)
	for wait := 5 * time.Millisecond; ; wait = min(2*wait, 200*time.Millisecond) {
		if _, err := ch.QueueDeclare(state, true, false, false, false, stateArgs); err != nil {
			return Command{}, nil, fmt.Errorf("declare %s: %w", state, err)
		}
		// The purge removes what is ready, not what is out (got by a reader that lost its
		// connection, and not yet returned): that comes back later, beside the new command
		// and older, and readers take the newest. The Killer does not wait for it as readers
		// do (statequeue.Read): a kill never waits on a reader.
		if _, err := ch.QueuePurge(state, false); err != nil {
			return Command{}, nil, err
		}
		// Dated now, after the connection is up: the command is as fresh as it can be. The
		// state's copy carries no reply address: it is never answered.
		cmd := k.command(queue, action)
		body, err := json.Marshal(cmd)
		if err != nil {
			return Command{}, nil, amqpx.GiveUp(err)
		}
		err = publish("", state, amqp.Publishing{Body: body, Timestamp: cmd.At})
		if err == nil {
			return cmd, body, nil
		}
		var returned *amqpx.ReturnedError
		if !errors.Is(err, amqpx.ErrNacked) && !errors.As(err, &returned) {
			return Command{}, nil, err
		}
		// Refused (over its limit: messages were slipped in after the purge) or unrouted (the
		// queue was deleted meanwhile): again.
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return Command{}, nil, ctx.Err()
		}
	}
}

// announce publishes cmd (whose JSON is body) to the kill exchange, signed with the reply
// address of out when answers are waited for, and records in out whether a listener heard
// it, and when.
func (k *Killer) announce(publish publishFunc, exchange string, cmd Command, body []byte, out *sent) error {
	live := amqp.Publishing{Body: body, Timestamp: cmd.At}
	if out.replies != nil {
		if len(k.cfg.Secret) > 0 {
			cmd.SignReply(k.cfg.Secret, out.replyTo, out.correlationID)
		}
		var err error
		if live.Body, err = json.Marshal(cmd); err != nil {
			return amqpx.GiveUp(err)
		}
		live.ReplyTo, live.CorrelationId = out.replyTo, out.correlationID
	}
	err := publish(exchange, "", live)
	var returned *amqpx.ReturnedError
	switch {
	case errors.As(err, &returned): // nobody is bound to the kill exchange
	case errors.Is(err, amqpx.ErrNacked):
		return errors.New("command not confirmed by the broker")
	case err != nil:
		return err
	}
	out.heard, out.at = returned == nil, time.Now()
	return nil
}

// command returns a command for queue dated now, signed if there is a secret. It is dated
// after every command this Killer dated before: a consumer takes a command dated as the one
// in force for the same one, and two commands within one tick of a coarse clock (or of a
// test's fake one, which stands still while goroutines run) would be one.
func (k *Killer) command(queue string, action Action) Command {
	k.mu.Lock()
	at := time.Now().UTC()
	if !at.After(k.last) {
		at = k.last.Add(time.Nanosecond)
	}
	k.last = at
	k.mu.Unlock()
	cmd := Command{Queue: queue, Action: action, At: at}
	if len(k.cfg.Secret) > 0 {
		cmd.Sign(k.cfg.Secret)
	}
	return cmd
}

// collect counts the answers to the command out into res, until Config.Wait is over, ctx
// ends, or every consumer the broker counted when the command was sent has answered: as
// many consuming ones as the queue had consumers, and as many in all as listened.
func (k *Killer) collect(ctx context.Context, out *sent, res *Result) {
	timer := time.NewTimer(k.cfg.Wait - time.Since(out.at))
	defer timer.Stop()
	defer func() { res.Waited = time.Since(out.at) }()
	instances, processes := map[string]bool{}, map[string]bool{}
	answered := 0 // consumers that were consuming the queue, and answered
	counted := res.QueueConsumers > 0 || res.Listeners > 0
	for !counted || answered < res.QueueConsumers || len(res.Answers) < res.Listeners {
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
		case len(k.cfg.Secret) > 0 && !hmac.Equal([]byte(a.Sig), []byte(a.mac(k.cfg.Secret, d.CorrelationId))):
			err = errors.New("a confirmation not signed with the secret")
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
