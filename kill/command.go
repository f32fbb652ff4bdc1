package kill

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
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
// last one they accepted (a replay). Verify checks all but the replay.
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

// VerifyReply checks, for a consumer with a secret, that the reply address a command came
// with (replyTo, correlationID) is the one its sender signed (see SignReply).
func (c Command) VerifyReply(secret []byte, replyTo, correlationID string) error {
	switch {
	case c.ReplySig == "":
		return errors.New("unsigned reply address")
	case !hmac.Equal([]byte(c.ReplySig), []byte(c.replyMAC(secret, replyTo, correlationID))):
		return errors.New("wrong reply address signature")
	}
	return nil
}

// Verify checks a received command as a consumer of queue does, with its secret (none:
// any signature, or none, is accepted) and its clock (now): the command must be for queue,
// name a known action, be signed with secret if there is one, not be dated ahead of now by
// more than skew nor, unless maxAge is 0, be older than maxAge. The error says which rule
// the command breaks.
func (c Command) Verify(queue string, secret []byte, now time.Time, maxAge, skew time.Duration) error {
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
