package ops

import (
	"fmt"

	"github.com/warrenmq/warren/kill"
)

// Kinds of Problem.
const (
	ProblemPoison     = "poison"      // messages wait in a work queue's poison queue
	ProblemHeld       = "held"        // keys of a queue ordered by key are held after a poisoned message
	ProblemNoConsumer = "no-consumer" // a work queue that exists has no consumer
	ProblemKilled     = "killed"      // a work queue's consumers were told to stop (kill)
	ProblemMissing    = "missing"     // a work queue named does not exist
	ProblemDown       = "down"        // a queue exists and does not serve messages
	ProblemDelay      = "delay"       // delay levels missing or down, messages parked
	ProblemBroker     = "broker"      // a broker alarm, a node resource near its limit, a policy that changes warren's queues
	ProblemVersion    = "version"     // the broker's version has a known hazard (Status.Warning)
)

// Problem is one thing wrong that Status found, in a line a reader acts on.
type Problem struct {
	// Kind is one of the Problem* constants.
	Kind string `json:"kind"`
	// Queue is the work queue it concerns, "" when it concerns the delay levels or the broker.
	Queue string `json:"queue,omitempty"`
	// Text says what is wrong, in a few words ("2 poison messages", "no consumer").
	Text string `json:"text"`
}

// Problems lists what is wrong in s, work queues first (in their order), then the delay
// levels, then the broker: poison messages waiting, held keys, a work queue with no consumer, killed,
// missing or down, delay levels missing or down, parked messages, the broker's alarms, node
// resources near their limit and policies that change warren's queues (Status.Broker), and
// the version's hazard (Status.Warning). Nil when nothing is.
func (s Status) Problems() []Problem {
	var ps []Problem
	add := func(kind, queue, format string, args ...any) {
		ps = append(ps, Problem{Kind: kind, Queue: queue, Text: fmt.Sprintf(format, args...)})
	}
	for _, q := range s.Queues {
		switch {
		case !q.Exists:
			add(ProblemMissing, q.Queue, "no such queue")
			continue
		case q.Unavailable():
			add(ProblemDown, q.Queue, "%s", q.State)
		}
		if q.Poison > 0 {
			add(ProblemPoison, q.Queue, "%d poison %s", q.Poison, plural(q.Poison, "message", "messages"))
		}
		if q.Held > 0 {
			add(ProblemHeld, q.Queue, "%d held %s (warren held list %s)", q.Held, plural(q.Held, "key", "keys"), q.Queue)
		}
		if q.Kill == kill.Stop || q.Kill == kill.Delete {
			add(ProblemKilled, q.Queue, "killed (%s)", q.Kill)
		} else if q.Consumers == 0 {
			add(ProblemNoConsumer, q.Queue, "no consumer")
		}
	}
	d := s.Delay
	switch {
	case len(d.Levels) > 0 && d.Missing == len(d.Levels):
		add(ProblemDelay, "", "delay levels %s not declared", d.Name)
	case d.Missing > 0:
		add(ProblemDelay, "", "%d of %d delay level queues missing", d.Missing, len(d.Levels))
	}
	if d.Unavailable > 0 {
		add(ProblemDelay, "", "%d of %d delay level queues down", d.Unavailable, len(d.Levels))
	}
	if d.Parked > 0 {
		add(ProblemDelay, "", "%d parked %s", d.Parked, plural(d.Parked, "message", "messages"))
	}
	if s.Broker != nil {
		for _, w := range s.Broker.Warnings() {
			add(ProblemBroker, "", "%s", w)
		}
	}
	if s.Warning != "" {
		add(ProblemVersion, "", "RabbitMQ %s can stop dead-lettering on one malformed message", s.ServerVersion)
	}
	return ps
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
