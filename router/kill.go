package router

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

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
// HMAC-SHA256 over queue, action and time; consumers refuse commands that are unsigned,
// wrongly signed, older than the maximum age or not newer than the last one they accepted.
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

// verify checks a received command against the consumer's queue and secret.
func (c Command) verify(queue string, secret []byte, maxAge time.Duration, now time.Time) error {
	switch {
	case c.Queue != queue:
		return fmt.Errorf("command for queue %q, not %q", c.Queue, queue)
	case c.Action != Stop && c.Action != Delete && c.Action != Resume:
		return fmt.Errorf("unknown action %q", c.Action)
	case len(secret) == 0:
		return nil
	case c.Sig == "":
		return errors.New("unsigned command")
	case !hmac.Equal([]byte(c.Sig), []byte(c.mac(secret))):
		return errors.New("wrong signature")
	case now.Sub(c.At) > maxAge || c.At.Sub(now) > maxAge:
		return fmt.Errorf("command of %s is outside the maximum age %s", c.At.Format(time.RFC3339Nano), maxAge)
	}
	return nil
}

// killMarker is the durable exchange whose existence remembers that queue was killed with
// action, for consumers that start later. With a secret its name carries an HMAC of the
// queue, so that nobody without the secret can make it.
func killMarker(queue string, action Action, secret []byte) string {
	name := topology.KillExchange(queue) + "." + string(action)
	if len(secret) > 0 {
		m := hmac.New(sha256.New, secret)
		fmt.Fprintf(m, "warren-kill-marker\n%s\n%s", queue, action)
		name += "." + hex.EncodeToString(m.Sum(nil))[:16]
	}
	return name
}

// KillEvent tells what a consumer did about the kill topic.
type KillEvent struct {
	Queue   string
	Handler string
	// State: "stopped" (no longer taking messages, nothing in flight), "resumed",
	// "draining" (taking messages until the queue is empty), "deleted" (the queue is gone,
	// the consumer ended), or "refused" (a command that failed verification; Err says why).
	State string
	// Action of the command that caused it; empty when a marker found at start did.
	Action Action
	At     time.Time
	Err    error
}

// KillerConfig configures a Killer.
type KillerConfig struct {
	// URL of the broker. Required.
	URL string
	// Secret signs commands; consumers with a secret refuse unsigned ones.
	Secret []byte
	// Timeout bounds each Kill and Resume, retries included. Default 30s.
	Timeout time.Duration
}

// Killer sends kill and resume commands to every consumer of a queue, in every process.
type Killer struct {
	cfg    KillerConfig
	logger watermill.LoggerAdapter
}

// NewKiller returns a Killer, or an error naming the first invalid field of config.
func NewKiller(config KillerConfig, logger watermill.LoggerAdapter) (*Killer, error) {
	if config.URL == "" {
		return nil, errors.New("router: KillerConfig.URL is empty")
	}
	if _, err := amqp.ParseURI(config.URL); err != nil {
		return nil, fmt.Errorf("router: KillerConfig.URL: %w", err)
	}
	if config.Timeout < 0 {
		return nil, fmt.Errorf("router: KillerConfig.Timeout %s is negative", config.Timeout)
	}
	if config.Timeout == 0 {
		config.Timeout = 30 * time.Second
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Killer{cfg: config, logger: logger}, nil
}

// Kill makes every consumer of queue stop (Stop) or drain the queue and delete it (Delete).
// The kill is remembered: consumers that start later do not consume until Resume.
func (k *Killer) Kill(ctx context.Context, queue string, action Action) error {
	if action != Stop && action != Delete {
		return fmt.Errorf("router: kill %s: action %q is neither %q nor %q", queue, action, Stop, Delete)
	}
	return k.send(ctx, queue, action)
}

// Resume lifts a Stop: the consumers of queue take messages again, and consumers that start
// later do too.
func (k *Killer) Resume(ctx context.Context, queue string) error {
	return k.send(ctx, queue, Resume)
}

func (k *Killer) send(ctx context.Context, queue string, action Action) error {
	cmd := Command{Queue: queue, Action: action, At: time.Now().UTC()}
	if len(k.cfg.Secret) > 0 {
		cmd.Sign(k.cfg.Secret)
	}
	body, err := json.Marshal(cmd)
	if err != nil {
		return err
	}
	return amqpx.Retry(ctx, k.cfg.Timeout, fmt.Sprintf("router: %s %s", action, queue), func(ctx context.Context) error {
		conn, err := amqpx.Dial(k.cfg.URL, "warren killer", k.cfg.Timeout)
		if err != nil {
			return err
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		err = amqpx.Do(ctx, ch, func() error {
			// The marker first: a consumer starting now either sees it or gets the command.
			if err := k.mark(ch, queue, action); err != nil {
				return err
			}
			if err := ch.ExchangeDeclare(topology.KillExchange(queue), amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
				return err
			}
			if err := ch.Confirm(false); err != nil {
				return err
			}
			dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, topology.KillExchange(queue), "", false, false, amqp.Publishing{
				ContentType: "application/json", DeliveryMode: amqp.Transient, Body: body, Timestamp: cmd.At,
			})
			if err != nil {
				return err
			}
			if ok, err := dc.WaitContext(ctx); err != nil || !ok {
				return fmt.Errorf("command not confirmed: %v", err)
			}
			return nil
		})
		return amqpx.PermanentIfRefused(err)
	})
}

// mark records action durably for consumers that start later.
func (k *Killer) mark(ch *amqp.Channel, queue string, action Action) error {
	for _, a := range []Action{Stop, Delete} {
		name := killMarker(queue, a, k.cfg.Secret)
		if a == action {
			if err := ch.ExchangeDeclare(name, amqp.ExchangeFanout, true, false, false, false, nil); err != nil {
				return err
			}
		} else if err := ch.ExchangeDelete(name, false, false); err != nil {
			return err
		}
	}
	return nil
}
