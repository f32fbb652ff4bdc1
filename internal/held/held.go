// Package held is the broker state of the held keys of a queue ordered by key
// (topology.Queue.Lanes): a key whose message was poisoned, whose later messages wait in its
// lane's held queue (topology.HeldQueue) until an operator releases them (handled in order) or
// skips them (poisoned). The state is one JSON document in the queue's state queue
// (topology.HeldState), read and written under its lock through package statequeue. The
// consumer of a key's lane writes a key in when it holds it and out when its queue is
// empty; package ops writes an operator's action on it, which that consumer carries out.
package held

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/statequeue"
	"github.com/warrenmq/warren/topology"
)

// Actions an operator asks of a held key (Entry.Action).
const (
	Release = "release" // its held messages go back to its lane, in order, and are handled
	Skip    = "skip"    // its held messages go to the poison queue, in order
)

// Entry is a held key.
type Entry struct {
	Key string `json:"key"`
	// Lane is the lane queue the key's messages come from (topology.LaneQueue).
	Lane string `json:"lane"`
	// Since is when the key was held; MessageID, Error and Handler are the poisoned
	// message's, which held it.
	Since     time.Time `json:"since"`
	MessageID string    `json:"message_id"`
	Error     string    `json:"error"`
	Handler   string    `json:"handler,omitempty"`
	// Action is what an operator asked (Release, Skip), "" while the key waits for one.
	Action string `json:"action,omitempty"`
}

// State is the held keys of a queue, by key. Version orders the documents a reader may
// find in the state queue (see statequeue.Args): the highest is the state.
type State struct {
	Version int64            `json:"version"`
	Keys    map[string]Entry `json:"keys"`
}

// LockQueue is the name of the lock queue of queue's held state (see statequeue.Lock).
func LockQueue(queue string) string { return topology.HeldState(queue) + ".lock" }

// Read returns queue's held state; an empty one when its state queue does not exist.
func Read(ctx context.Context, conn *amqp.Connection, queue string) (State, error) {
	return Update(ctx, conn, queue, nil)
}

// Update reads queue's held state under its lock and, when change reports a change, writes
// the changed state; it returns the state as it then is. A nil change only reads. The
// state queue is declared when a change is to be written into a queue that does not exist.
func Update(ctx context.Context, conn *amqp.Connection, queue string, change func(*State) bool) (State, error) {
	name := topology.HeldState(queue)
	if change == nil { // a read of a queue that never held a key needs no lock (a lane's consumer reads as it starts)
		exists, err := statequeue.Exists(ctx, conn, name)
		if err != nil {
			return State{}, fmt.Errorf("held keys of %s: %w", queue, err)
		}
		if !exists {
			return State{Keys: map[string]Entry{}}, nil
		}
	}
	unlock, err := statequeue.Lock(ctx, conn, LockQueue(queue))
	if err != nil {
		return State{}, err
	}
	defer unlock()
	var st State
	err = statequeue.OnChannel(conn, func(ch *amqp.Channel) error {
		ds, err := statequeue.Read(ctx, ch, name, statequeue.ReadMax)
		if amqpx.IsNotFound(err) {
			st = State{Keys: map[string]Entry{}}
			if change == nil || !change(&st) {
				return nil
			}
			return write(ctx, conn, name, st)
		}
		if err != nil {
			return err
		}
		var stale []amqp.Delivery
		var body []byte
		st, body, stale = newest(ds)
		if change != nil && change(&st) {
			st.Version++
			if body, err = json.Marshal(st); err != nil {
				return err
			}
		}
		if body == nil { // nothing readable: nothing to put back
			return statequeue.Settle(ctx, ch, name, ds, ds, nil)
		}
		return statequeue.Settle(ctx, ch, name, ds, stale, body)
	})
	if err != nil {
		return State{}, fmt.Errorf("held keys of %s: %w", queue, err)
	}
	return st, nil
}

// newest returns the state of the highest version among ds, its body, and the others
// (stale); a body that is not a state is stale too.
func newest(ds []amqp.Delivery) (st State, body []byte, stale []amqp.Delivery) {
	best := -1
	for i, d := range ds {
		var x State
		if err := json.Unmarshal(d.Body, &x); err == nil && (best < 0 || x.Version > st.Version) {
			st, best = x, i
		}
	}
	for i, d := range ds {
		if i != best {
			stale = append(stale, d)
		}
	}
	if best >= 0 {
		body = ds[best].Body
	}
	if st.Keys == nil {
		st.Keys = map[string]Entry{}
	}
	return st, body, stale
}

// write declares the state queue name on a channel of its own and publishes st into it.
func write(ctx context.Context, conn *amqp.Connection, name string, st State) error {
	st.Version++
	body, err := json.Marshal(st)
	if err != nil {
		return err
	}
	return statequeue.OnChannel(conn, func(ch *amqp.Channel) error {
		return amqpx.Do(ctx, ch, func() error {
			if _, err := ch.QueueDeclare(name, true, false, false, false, statequeue.Args); err != nil {
				return err
			}
			return statequeue.Settle(ctx, ch, name, nil, nil, body)
		})
	})
}
