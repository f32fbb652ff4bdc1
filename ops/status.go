package ops

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// QueueStatus is the state of one work queue.
type QueueStatus struct {
	Queue string `json:"queue"`
	// Exists is false for a queue the broker does not have; the other fields are then zero.
	Exists bool `json:"exists"`
	// Ready is the number of messages waiting to be delivered. AMQP 0-9-1 does not tell how
	// many are delivered and unacknowledged: `rabbitmqctl list_queues name
	// messages_unacknowledged` or the management API do.
	Ready int `json:"ready"`
	// Consumers is the number of consumers of the queue (one per router handler).
	Consumers int `json:"consumers"`
	// Kill is the remembered kill command ("stop", "delete", or "resume" once lifted), "" if
	// the queue was never killed; KillAt is when it was sent.
	Kill   router.Action `json:"kill,omitempty"`
	KillAt time.Time     `json:"kill_at,omitzero"`
	// Poison is the number of messages in its poison queue (-1 if there is none).
	Poison int `json:"poison"`
}

// LevelStatus is one delay level queue.
type LevelStatus struct {
	Queue string `json:"queue"`
	// TTL is how long a message waits in it; in JSON ttl_ms, in milliseconds (see MarshalJSON).
	TTL      time.Duration `json:"-"`
	Messages int           `json:"messages"`
	Exists   bool          `json:"exists"`
}

// DelayStatus is the state of the delay levels.
type DelayStatus struct {
	// Name of the layout (topology.Delay.Name).
	Name string `json:"name"`
	// Levels lists every level queue.
	Levels []LevelStatus `json:"levels"`
	// Waiting is the number of messages in all levels.
	Waiting int `json:"waiting"`
	// Missing is the number of level queues that do not exist (all of them when the levels
	// were never declared).
	Missing int `json:"missing"`
	// Parked is the number of messages in the parking queue (-1 if there is none).
	Parked int `json:"parked"`
}

// Status is what Status returns.
type Status struct {
	Queues []QueueStatus `json:"queues"`
	Delay  DelayStatus   `json:"delay"`
	At     time.Time     `json:"at"`
}

// Status reads the state of queues (work queues, by name) and of the delay levels.
func (o *Ops) Status(ctx context.Context, queues ...string) (Status, error) {
	s := Status{At: time.Now().UTC()}
	err := o.call(ctx, "ops: status", func(ctx context.Context, _ *amqp.Channel) error {
		conn, err := o.connection(ctx)
		if err != nil {
			return err
		}
		in := &inspector{conn: conn}
		defer in.close()
		s.Queues = s.Queues[:0]
		for _, name := range queues {
			q, err := o.queueStatus(ctx, conn, in, name)
			if err != nil {
				return err
			}
			s.Queues = append(s.Queues, q)
		}
		s.Delay, err = o.delayStatus(ctx, in)
		return err
	})
	return s, err
}

func (o *Ops) queueStatus(ctx context.Context, conn *amqp.Connection, in *inspector, name string) (QueueStatus, error) {
	s := QueueStatus{Queue: name, Poison: -1}
	q, ok, err := in.inspect(ctx, route{key: name})
	if err != nil || !ok {
		return s, err
	}
	s.Exists, s.Ready, s.Consumers = true, q.Messages, q.Consumers
	if p, ok, err := in.inspect(ctx, route{key: topology.PoisonQueue(name)}); err != nil {
		return s, err
	} else if ok {
		s.Poison = p.Messages
	}
	c, found, err := router.KillState(ctx, conn, name, o.cfg.KillSecret)
	if err != nil {
		return s, err
	}
	if found {
		s.Kill, s.KillAt = c.Action, c.At
	}
	return s, nil
}

func (o *Ops) delayStatus(ctx context.Context, in *inspector) (DelayStatus, error) {
	d := o.cfg.Delay
	s := DelayStatus{Name: d.Name(), Parked: -1}
	for p := range d.Levels {
		for digit := 1; digit < d.Radix; digit++ {
			l := LevelStatus{Queue: d.LevelQueue(p, digit), TTL: d.TTL(p, digit)}
			q, ok, err := in.inspect(ctx, route{key: l.Queue})
			if err != nil {
				return s, fmt.Errorf("%s: %w", l.Queue, err)
			}
			l.Exists, l.Messages = ok, q.Messages
			if !ok {
				s.Missing++
			}
			s.Waiting += l.Messages
			s.Levels = append(s.Levels, l)
		}
	}
	q, ok, err := in.inspect(ctx, route{key: d.ParkingQueue()})
	if err != nil {
		return s, err
	}
	if ok {
		s.Parked = q.Messages
	}
	return s, nil
}
