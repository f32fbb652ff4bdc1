package topology

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/contract"
)

// MaxLanes is the most lanes a queue ordered by key may have (Queue.Lanes). Every lane is a
// queue of the broker's; a few dozen are usually plenty.
const MaxLanes = 1024

// LaneQueue is the name of lane lane of ordered queue queue (see Queue.Lanes).
func LaneQueue(queue string, lane int) string { return queue + ".lane." + strconv.Itoa(lane) }

// ParseLane reads name as a lane's queue name (see LaneQueue): the queue it is a lane of and
// its number, ok false when it is not one. The name says nothing of whether the queue is
// ordered: the caller checks that queue has more than lane lanes.
func ParseLane(name string) (queue string, lane int, ok bool) {
	i := strings.LastIndex(name, ".lane.")
	if i <= 0 {
		return "", 0, false
	}
	lane, err := strconv.Atoi(name[i+len(".lane."):])
	if err != nil || lane < 0 || LaneQueue(name[:i], lane) != name {
		return "", 0, false
	}
	return name[:i], lane, true
}

// Lane is the lane of a queue of lanes lanes that the messages of order key key go to: the
// 32-bit FNV-1a hash of the key's bytes modulo lanes. A publisher outside warren that routes
// by the same rule (to the default exchange, routing key LaneQueue(queue, Lane(key, lanes)),
// with the key in the warren_order_key header) keeps warren's order.
func Lane(key string, lanes int) int {
	h := uint32(2166136261) // FNV-1a 32, in line: no hash.Hash32 and no copy of the key a publish
	for i := 0; i < len(key); i++ {
		h ^= uint32(key[i])
		h *= 16777619
	}
	return int(h % uint32(lanes))
}

// DeclareLane declares lane lane of ordered queue q (see Queue.Lanes), as DeclareQueue
// would, but only what consuming the lane needs: the lane's queue, its held queue and its
// binding from the delivery exchange, and q's poison queue, which the lane dead-letters into.
// A process takes its lanes one by one: each declares a few objects rather than all of q's.
func (b *Builder) DeclareLane(ctx context.Context, ch *amqp.Channel, q Queue, lane int) error {
	if err := (Topology{Queues: []Queue{q}}).ValidateFor(b.cfg, b.server); err != nil {
		return amqpx.GiveUp(err) // retrying cannot change it
	}
	name := LaneQueue(q.Name, lane)
	objs := b.deliveryObjects()
	for _, o := range b.queueObjects(q) {
		switch {
		case o.what == "queue" && (o.name == PoisonQueue(q.Name) || o.name == name || o.name == HeldQueue(q.Name, lane)),
			o.what == "binding" && o.binding.Queue == name:
			objs = append(objs, o)
		}
	}
	return b.declare(ctx, ch, objs)
}

// laneObjects are the lane queues of ordered queue q, each bound to the delivery exchange of
// the delay levels by its own name: a lane's queue is a work queue of q's arguments (it
// dead-letters into q's poison queue) with a single active consumer; and each lane's held
// queue (HeldQueue), with the arguments of q's poison queue and a single active consumer.
func (b *Builder) laneObjects(q Queue) []object {
	typ := b.QueueType(q)
	var objs []object
	for i := range q.Lanes {
		lane := LaneQueue(q.Name, i)
		args := b.QueueArgs(q)
		args["x-single-active-consumer"] = true
		held := b.poisonArgs(q)
		held["x-single-active-consumer"] = true
		objs = append(objs, object{what: "queue", name: lane, args: args, role: workQueue, typ: typ},
			object{what: "queue", name: HeldQueue(q.Name, i), args: held, role: heldQueue, typ: typ})
		if !b.cfg.Delay.Disabled {
			bd := Binding{Exchange: b.cfg.Delay.DeliveryExchange(), Queue: lane, Headers: map[string]string{contract.DestQueueHeader: lane}}
			objs = append(objs, object{what: "binding", name: bd.String(), binding: bd})
		}
	}
	return objs
}

// laneChanges reports, for every ordered queue of t, a broker whose lanes of it (lane 0 up to
// the first missing) are not the topology's. Such a change moves keys to other lanes, and a
// key's messages left in its old lane would be handled out of order: it is refused (an error
// of each) while any old lane holds a message or has a consumer, and otherwise returned as
// drained, with the lanes to delete.
func (b *Builder) laneChanges(ctx context.Context, conn *amqp.Connection, t Topology) (refused []string, surplus []string, err error) {
	var ch *amqp.Channel
	defer func() {
		if ch != nil {
			_ = ch.Close()
		}
	}()
	// inspect returns the passive declare of queue name: its message and consumer counts, or
	// ok false when it does not exist (which closes the channel).
	inspect := func(name string) (q amqp.Queue, ok bool, err error) {
		if ch == nil || ch.IsClosed() {
			if ch, err = conn.Channel(); err != nil {
				return q, false, fmt.Errorf("topology: open channel: %w", err)
			}
		}
		qctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
		defer cancel()
		err = amqpx.Do(qctx, ch, func() (err error) {
			q, err = ch.QueueDeclarePassive(name, true, false, false, false, nil)
			return err
		})
		if amqpx.IsNotFound(err) {
			return q, false, nil
		}
		return q, err == nil, err
	}
	for _, q := range t.Queues {
		if q.Lanes == 0 {
			continue
		}
		existing := 0
		var busy []string
		for ; existing < MaxLanes; existing++ {
			st, ok, err := inspect(LaneQueue(q.Name, existing))
			if err != nil {
				return nil, nil, err
			}
			if !ok {
				break
			}
			if st.Messages > 0 || st.Consumers > 0 {
				busy = append(busy, fmt.Sprintf("%s (%d ready, %d consumers)", st.Name, st.Messages, st.Consumers))
			}
			if held, ok, err := inspect(HeldQueue(q.Name, existing)); err != nil {
				return nil, nil, err
			} else if ok && held.Messages > 0 {
				busy = append(busy, fmt.Sprintf("%s (%d held)", held.Name, held.Messages))
			}
		}
		if existing == 0 || existing == q.Lanes {
			continue // none declared yet, or the same
		}
		if len(busy) > 0 {
			refused = append(refused, fmt.Sprintf("queue %q has %d lanes on the broker and %d in the topology: a change of lanes moves keys "+
				"to other lanes, refused until the old lanes are drained and their consumers stopped (docs/ordering.md): %s",
				q.Name, existing, q.Lanes, strings.Join(busy, ", ")))
			continue
		}
		for i := q.Lanes; i < existing; i++ {
			surplus = append(surplus, LaneQueue(q.Name, i), HeldQueue(q.Name, i))
		}
	}
	return refused, surplus, nil
}

// HeldState is the name of the state queue of ordered queue queue's held keys: a key whose
// message was poisoned, whose later messages wait in its HeldQueue until an operator
// releases or skips them (docs/ordering.md).
func HeldState(queue string) string { return queue + ".held" }

// HeldQueue is the name of the queue where the messages of the held keys of lane lane of
// ordered queue queue wait, in their order: LaneQueue(queue, lane)+".held", declared with
// the lane, with the arguments of its poison queue and a single active consumer
// (docs/ordering.md).
func HeldQueue(queue string, lane int) string { return LaneQueue(queue, lane) + ".held" }
