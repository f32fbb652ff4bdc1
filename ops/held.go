package ops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/held"
	"github.com/warrenmq/warren/topology"
)

// HeldKey is an order key of a queue ordered by key (topology.Queue.Lanes) whose message was
// poisoned: its later messages wait, parked in its queue, until it is released or skipped
// (docs/ordering.md).
type HeldKey struct {
	Key string `json:"key"`
	// Lane is the lane queue the key's messages come from; Queue the one they wait in, the
	// lane's held queue (topology.HeldQueue), and Messages how many messages wait there,
	// those of the lane's other held keys included.
	Lane     string `json:"lane"`
	Queue    string `json:"queue"`
	Messages int    `json:"messages"`
	// Since is when the key was held; MessageID, Error and Handler are the poisoned
	// message's, which is in the poison queue.
	Since     time.Time `json:"since"`
	MessageID string    `json:"message_id"`
	Error     string    `json:"error"`
	Handler   string    `json:"handler,omitempty"`
	// Action is what was asked and is under way (release, skip); "" while it waits.
	Action string `json:"action,omitempty"`
}

// ErrNotHeld is wrapped by the error of an action on a key that is not held.
var ErrNotHeld = errors.New("the key is not held")

// Held returns the held keys of the ordered queue queue, oldest first; none when nothing was
// ever held.
func (o *Ops) Held(ctx context.Context, queue string) ([]HeldKey, error) {
	var st held.State
	if err := o.onConnection(ctx, "ops: held keys of "+queue, func(ctx context.Context, conn *amqp.Connection) (err error) {
		st, err = held.Read(ctx, conn, queue)
		return err
	}); err != nil {
		return nil, err
	}
	var keys []HeldKey
	err := o.onConnection(ctx, "ops: held queues of "+queue, func(ctx context.Context, conn *amqp.Connection) error {
		in := &inspector{conn: conn}
		defer in.close()
		keys = keys[:0]
		waiting := map[string]int{} // by held queue: a lane's keys share it
		for _, e := range st.Keys {
			_, lane, _ := topology.ParseLane(e.Lane)
			k := HeldKey{Key: e.Key, Lane: e.Lane, Queue: topology.HeldQueue(queue, lane), Since: e.Since,
				MessageID: e.MessageID, Error: e.Error, Handler: e.Handler, Action: e.Action}
			n, ok := waiting[k.Queue]
			if !ok {
				q, _, err := in.inspect(ctx, route{key: k.Queue})
				if err != nil {
					return err
				}
				n, waiting[k.Queue] = q.Messages, q.Messages
			}
			k.Messages = n
			keys = append(keys, k)
		}
		return nil
	})
	slices.SortFunc(keys, func(a, b HeldKey) int {
		if c := a.Since.Compare(b.Since); c != 0 {
			return c
		}
		return strings.Compare(a.Key, b.Key)
	})
	return keys, err
}

// ReleaseKey releases held key key of the ordered queue queue: its held messages go back to
// its lane and are handled, in their order, one at a time, and then its later messages as
// they come. The consumer of its lane carries it out within a second or so (none does while
// no process handles the queue). The poisoned message that held it stays in the poison
// queue. A key whose message is poisoned again while it is released is held again.
func (o *Ops) ReleaseKey(ctx context.Context, queue, key string) error {
	return o.act(ctx, queue, key, held.Release)
}

// SkipKey skips held key key of the ordered queue queue: its held messages go to the poison
// queue, in their order (warren.PoisonReasonSkipped), and its later messages are handled as
// they come. Carried out as ReleaseKey is.
func (o *Ops) SkipKey(ctx context.Context, queue, key string) error {
	return o.act(ctx, queue, key, held.Skip)
}

func (o *Ops) act(ctx context.Context, queue, key, action string) error {
	found := false
	err := o.onConnection(ctx, fmt.Sprintf("ops: %s held key %q of %s", action, key, queue), func(ctx context.Context, conn *amqp.Connection) error {
		_, err := held.Update(ctx, conn, queue, func(st *held.State) bool {
			e, ok := st.Keys[key]
			found = ok
			if !ok || e.Action == action {
				return false
			}
			e.Action = action
			st.Keys[key] = e
			return true
		})
		return err
	})
	if err == nil && !found {
		err = fmt.Errorf("ops: %s key %q of %s: %w", action, key, queue, ErrNotHeld)
	}
	return err
}
