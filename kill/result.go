package kill

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"
)

// Result is what came of a command: what the queue looked like when it was sent, and the
// consumers' confirmations.
type Result struct {
	Queue  string `json:"queue"`
	Action Action `json:"action"`
	// QueueExists: the queue existed when the command was sent (it may not with
	// Config.Force).
	QueueExists bool `json:"queue_exists"`
	// QueueConsumers is how many consumers the queue had when the command was sent (its
	// consumer_count): each consuming warren subscription has one, a stopped one none, and
	// consumers that are not warren's (which do not obey commands) count too.
	QueueConsumers int `json:"queue_consumers"`
	// Listeners is how many warren subscriptions listened to the queue's kill topic when
	// the command was sent, stopped ones included (the consumer count of ListenerQueue;
	// subscriptions of warren versions that do not count themselves are not in it).
	Listeners int `json:"listeners"`
	// Heard: the command reached at least one consumer (else the error wraps ErrNoListener).
	Heard bool `json:"heard"`
	// Waited is how long confirmations were waited for: 0 without Config.Wait, less
	// than Wait when every consumer counted (QueueConsumers, Listeners) answered. In JSON
	// waited_ms, in milliseconds (see MarshalJSON).
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
	// consumer's second answer, or, with a Config.Secret, a confirmation not signed with it.
	Ignored int `json:"ignored"`
	// Answers lists the answers counted, in the order they came.
	Answers []Answer `json:"answers"`
}

// Confirmed reports whether the command is known to be in force everywhere: nobody refused
// it, and either nobody heard it (it is remembered for the consumers that start) or every
// consumer the broker counted confirmed it: every consumer the queue had and every
// listener (and at least one, when neither was counted). Without Config.Wait, nothing is
// confirmed.
func (r Result) Confirmed() bool {
	switch {
	case !r.Heard:
		return true
	case r.Refused > 0 || r.Consumers == 0:
		return false
	}
	return r.consuming() >= r.QueueConsumers && r.Consumers >= r.Listeners
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

// Answer is what a consumer (a subscription of a consumer.Subscriber) publishes to the reply address
// of a live command it acted on: once it is in the state the command asks for ("stopped",
// once nothing is in flight any more; "draining"; "resumed", also when it was in that state
// already), or "refused", with the reason. Commands read from the kill state queue (when a
// consumer starts or reconnects) are never answered.
//
// Answers are published fire and forget (not mandatory, not confirmed, on a channel of
// their own, from a goroutine of their own): a consumer never waits or fails because of one.
// They go only to a server-named queue ("amq.gen-…", a name no client can choose, so never a
// work queue). With a secret, a consumer answers a command it obeyed only if the reply
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

// Sign sets the answer's signature (Sig) for the command of correlationID, with the secret
// of the consumer that answers: a Killer with that secret counts only confirmations signed
// with it.
func (a *Answer) Sign(secret []byte, correlationID string) { a.Sig = a.mac(secret, correlationID) }

func (a Answer) mac(secret []byte, correlationID string) string {
	m := hmac.New(sha256.New, secret)
	fmt.Fprintf(m, "warren-kill-answer\n%s\n%s\n%s\n%s\n%t\n%s\n%d\n%s\n%s\n%s", correlationID, a.Queue, a.Handler, a.State,
		a.Consuming, a.Host, a.PID, a.Process, a.Instance, a.Error)
	return hex.EncodeToString(m.Sum(nil))
}
