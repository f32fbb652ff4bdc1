package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/held"
	"github.com/warrenmq/warren/internal/statequeue"
	"github.com/warrenmq/warren/topology"
)

// holdsWatch is how often a lane with held keys reads the held state for an operator's
// action on them.
const holdsWatch = time.Second

// laneHolds is what the subscription of a lane of a queue ordered by key knows of its lane's
// held keys (see package held). It is loaded from the held state when a consume session's
// consumer becomes active (its first delivery: the lane's single active consumer gets
// nothing before the previous one's channel is closed, and that one wrote its holds before),
// and kept by this process while it consumes the lane: the lane's keys are held and let go
// only by it.
//
// A message of a held key is parked: published, in the order of the lane, into the key's
// queue (topology.HeldQueue), and then acked. An operator's action (package held) is carried
// out by drain: on release, the key's messages are moved back into the lane one at a time,
// each marked (contract.ReleasedHeader), which passes the hold, and the next is moved once
// it is settled; on skip, they are poisoned. The key is let go once its queue is empty and no
// park is in flight: what comes after is newer than all it held.
type laneHolds struct {
	mu   sync.Mutex // guards keys and seq
	keys map[string]*heldKey
	seq  int64 // counts this process's writes: a read of the state begun before one is stale

	writing sync.Mutex // one write of the state at a time, holds and lets go in their order
}

type heldKey struct {
	held.Entry
	parking  int           // parks in flight
	draining bool          // a drain runs
	moved    chan struct{} // closed when a marked message of the key is settled
}

// holdsConn returns the publishing connection, on which the held state is read and written
// and held messages moved (see consumerconns.Conns).
func (sub *subscription) holdsConn(ctx context.Context) (*amqp.Connection, error) {
	return sub.s.conns.Publish.Get(ctx)
}

// loadHolds replaces what the subscription knows of its lane's held keys with the state.
func (sub *subscription) loadHolds() error {
	ctx, cancel := context.WithTimeout(context.Background(), sub.s.cfg.Connection.ConnectTimeout)
	defer cancel()
	conn, err := sub.holdsConn(ctx)
	if err != nil {
		return err
	}
	st, err := held.Read(ctx, conn, sub.queue)
	if err != nil {
		return err
	}
	keys := map[string]*heldKey{}
	for k, e := range st.Keys {
		if e.Lane == sub.consumed {
			keys[k] = &heldKey{Entry: e}
		}
	}
	sub.holds.mu.Lock()
	sub.holds.keys = keys
	sub.holds.seq++
	sub.holds.mu.Unlock()
	return nil
}

// holdKey holds the key of h, whose handler failed for good with cause (see
// contract.Handling.Hold): the state first, then this process's view, then the key's queue
// is declared. A key held already is held again by this message: an action under way on it
// stops.
func (sub *subscription) holdKey(h *handout, cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), sub.s.cfg.Connection.ConnectTimeout)
	defer cancel()
	conn, err := sub.holdsConn(ctx)
	if err != nil {
		return err
	}
	hs := sub.holds
	hs.writing.Lock()
	defer hs.writing.Unlock()
	e := held.Entry{Key: h.key, Lane: sub.consumed, Since: time.Now().UTC(), MessageID: h.msg.UUID,
		Error: cause.Error(), Handler: sub.s.cfg.HandlerName}
	if _, err := held.Update(ctx, conn, sub.queue, func(st *held.State) bool {
		if old, ok := st.Keys[h.key]; ok {
			e.Since = old.Since
		}
		st.Keys[h.key] = e
		return true
	}); err != nil {
		return err
	}
	hs.mu.Lock()
	hs.seq++
	if k := hs.keys[h.key]; k != nil {
		k.Entry = e
	} else {
		hs.keys[h.key] = &heldKey{Entry: e}
	}
	hs.mu.Unlock()
	sub.s.logger.Error("Order key held: its later messages wait until it is released or skipped", cause,
		watermill.LogFields{"queue": sub.queue, "lane": sub.consumed, "key": h.key, "message_uuid": h.msg.UUID})
	return statequeue.OnChannel(conn, func(ch *amqp.Channel) error { return declareHeld(ctx, ch, sub.queue, h.key) })
}

func declareHeld(ctx context.Context, ch *amqp.Channel, queue, key string) error {
	return amqpx.Do(ctx, ch, func() error {
		_, err := ch.QueueDeclare(topology.HeldQueue(queue, key), true, false, false, false, held.QueueArgs)
		return err
	})
}

// parks reports whether h is to be parked, its key being held (a marked message passes), and
// counts the park in flight.
func (hs *laneHolds) parks(h *handout) bool {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	k := hs.keys[h.key]
	if k == nil || h.marked {
		return false
	}
	k.parking++
	return true
}

// park publishes h's delivery into its key's queue and acks it; if it cannot, the session
// ends and the delivery goes back to the lane with the channel, in order (see keyGate). Its
// expiration is not kept: a held message waits for an operator.
func (sub *subscription) park(h *handout) {
	err := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), sub.s.cfg.Connection.ConnectTimeout)
		defer cancel()
		conn, err := sub.holdsConn(ctx)
		if err != nil {
			return err
		}
		return statequeue.OnChannel(conn, func(ch *amqp.Channel) error {
			if err := declareHeld(ctx, ch, sub.queue, h.key); err != nil {
				return err
			}
			headers := amqp.Table{}
			for k, v := range h.raw.Headers {
				headers[k] = v
			}
			p := publishingOf(*h.raw, headers)
			return amqpx.PublishConfirmed(ctx, ch, "", topology.HeldQueue(sub.queue, h.key), true, p)
		})
	}()
	hs := sub.holds
	hs.mu.Lock()
	if k := hs.keys[h.key]; k != nil {
		k.parking--
	}
	hs.mu.Unlock()
	if err != nil {
		sub.s.logger.Error("Cannot park a message of a held key: it goes back to its lane", err,
			watermill.LogFields{"queue": sub.queue, "lane": sub.consumed, "key": h.key, "message_uuid": h.msg.UUID})
		h.settleAs(false, false)
		return
	}
	h.settleAs(true, false) // parked, not handled: a copy moved back is handled
}

// movedSettled is told that a marked message of key was settled: the drain moves the next.
func (hs *laneHolds) movedSettled(key string) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if k := hs.keys[key]; k != nil && k.moved != nil {
		close(k.moved)
		k.moved = nil
	}
}

// watchHolds reads the held state every holdsWatch while the lane has held keys, until the
// session stops, and starts a drain for each key an operator acted on.
func (sub *subscription) watchHolds(cs *channelState) {
	t := time.NewTicker(holdsWatch)
	defer t.Stop()
	hs := sub.holds
	for {
		select {
		case <-t.C:
		case <-cs.stopping:
			return
		}
		hs.mu.Lock()
		n, seq := len(hs.keys), hs.seq
		hs.mu.Unlock()
		if n == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), sub.s.cfg.Connection.ConnectTimeout)
		st, err := func() (held.State, error) {
			conn, err := sub.holdsConn(ctx)
			if err != nil {
				return held.State{}, err
			}
			return held.Read(ctx, conn, sub.queue)
		}()
		cancel()
		if err != nil {
			sub.s.logger.Debug("Held keys not read", watermill.LogFields{"queue": sub.queue, "err": err.Error()})
			continue
		}
		hs.mu.Lock()
		if hs.seq == seq { // else written meanwhile: read again next turn
			for key, k := range hs.keys {
				if e, ok := st.Keys[key]; ok && e.MessageID == k.MessageID {
					k.Action = e.Action
				}
				if k.Action != "" && !k.draining {
					k.draining = true
					go sub.drain(key, cs)
				}
			}
		}
		hs.mu.Unlock()
	}
}

// errHoldChanged ends a drain whose key was held again, or whose action was withdrawn.
var errHoldChanged = errors.New("the key was held again")

// drain carries out the operator's action on key (see laneHolds) until the key's queue is
// empty, the key is held again, or the session stops (the next owner of the lane takes over
// from the state).
func (sub *subscription) drain(key string, cs *channelState) {
	hs := sub.holds
	fields := watermill.LogFields{"queue": sub.queue, "lane": sub.consumed, "key": key}
	err := sub.drainKey(key, cs)
	hs.mu.Lock()
	if k := hs.keys[key]; k != nil {
		k.draining = false
	}
	hs.mu.Unlock()
	switch {
	case err == nil:
		sub.s.logger.Info("Held key let go", fields)
	case errors.Is(err, errHoldChanged):
	default:
		sub.s.logger.Error("Held key not drained: tried again", err, fields)
	}
}

func (sub *subscription) drainKey(key string, cs *channelState) error {
	hs := sub.holds
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-cs.stopping:
			cancel()
		case <-ctx.Done():
		}
	}()
	conn, err := sub.holdsConn(ctx)
	if err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	queue := topology.HeldQueue(sub.queue, key)
	for {
		hs.mu.Lock()
		var entry held.Entry
		if k := hs.keys[key]; k != nil {
			entry = k.Entry
		}
		hs.mu.Unlock()
		action := entry.Action
		if action == "" {
			return errHoldChanged
		}
		var d amqp.Delivery
		var ok bool
		if err := amqpx.Do(ctx, ch, func() (err error) { d, ok, err = ch.Get(queue, false); return err }); err != nil && !amqpx.IsNotFound(err) {
			return err
		}
		if !ok {
			if done, err := sub.letGo(ctx, conn, key, queue); done || err != nil {
				return err
			}
			select { // a park in flight: its message is to come
			case <-time.After(10 * time.Millisecond):
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if action == held.Skip {
			err = sub.poisonSkipped(ctx, ch, d, entry)
		} else {
			err = sub.moveBack(ctx, ch, d, key)
		}
		if err != nil {
			return err
		}
		if err := d.Ack(false); err != nil {
			return err
		}
		if action == held.Release {
			if err := sub.awaitMoved(ctx, key); err != nil {
				return err
			}
		}
	}
}

// moveBack publishes d into the lane, marked, and has the key wait for it (see awaitMoved).
func (sub *subscription) moveBack(ctx context.Context, ch *amqp.Channel, d amqp.Delivery, key string) error {
	hs := sub.holds
	hs.mu.Lock()
	if k := hs.keys[key]; k != nil {
		k.moved = make(chan struct{})
	}
	hs.mu.Unlock()
	headers := amqp.Table{}
	for k, v := range d.Headers {
		headers[k] = v
	}
	headers[contract.ReleasedHeader] = true
	return amqpx.PublishConfirmed(ctx, ch, "", sub.consumed, true, publishingOf(d, headers))
}

// awaitMoved waits until the marked message moved last is settled.
func (sub *subscription) awaitMoved(ctx context.Context, key string) error {
	hs := sub.holds
	hs.mu.Lock()
	var moved chan struct{}
	if k := hs.keys[key]; k != nil {
		moved = k.moved
	}
	hs.mu.Unlock()
	if moved == nil {
		return nil
	}
	select {
	case <-moved:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// poisonSkipped publishes d, a held message an operator skipped, into the poison queue.
func (sub *subscription) poisonSkipped(ctx context.Context, ch *amqp.Channel, d amqp.Delivery, e held.Entry) error {
	headers := amqp.Table{}
	for k, v := range d.Headers {
		if !warren.IsBookkeeping(k) {
			headers[k] = v
		}
	}
	now := time.Now()
	warren.PoisonRecord{
		Error: fmt.Sprintf("its order key %q was held since %s behind message %s (%s), and skipped", e.Key,
			e.Since.Format(time.RFC3339), e.MessageID, e.Error),
		Reason: warren.PoisonReasonSkipped, Handler: sub.s.cfg.HandlerName, Queue: sub.queue,
		Origin:   &warren.Origin{RoutingKey: sub.consumed},
		Attempts: 0, FirstFailure: now, LastFailure: now, TraceID: traceID(d.Headers),
	}.EncodeTable(headers)
	return amqpx.PublishConfirmed(ctx, ch, "", topology.PoisonQueue(sub.queue), true, publishingOf(d, headers))
}

// letGo lets key go when its queue is empty and no park is in flight, and reports whether
// it did: this process's view first (what comes after is handled), then the state, then the
// key's queue is deleted (if empty).
func (sub *subscription) letGo(ctx context.Context, conn *amqp.Connection, key, queue string) (bool, error) {
	hs := sub.holds
	hs.writing.Lock()
	defer hs.writing.Unlock()
	hs.mu.Lock()
	k := hs.keys[key]
	if k == nil || k.Action == "" {
		hs.mu.Unlock()
		return false, errHoldChanged
	}
	if k.parking > 0 {
		hs.mu.Unlock()
		return false, nil
	}
	// No park is in flight and none can start while mu is held: the queue's count is final.
	var n int
	err := statequeue.OnChannel(conn, func(ch *amqp.Channel) error {
		return amqpx.Do(ctx, ch, func() error {
			q, err := ch.QueueDeclarePassive(queue, true, false, false, false, held.QueueArgs)
			n = q.Messages
			return err
		})
	})
	if err != nil && !amqpx.IsNotFound(err) || n > 0 {
		hs.mu.Unlock()
		return false, err
	}
	entry := k.Entry
	delete(hs.keys, key)
	hs.seq++
	hs.mu.Unlock()
	if _, err := held.Update(ctx, conn, sub.queue, func(st *held.State) bool {
		if e, ok := st.Keys[key]; !ok || e.MessageID != entry.MessageID {
			return false
		}
		delete(st.Keys, key)
		return true
	}); err != nil {
		// Let go here; the state still holds it: the next owner of the lane, or the next
		// read, parks its messages and drains them again.
		return true, err
	}
	return true, statequeue.OnChannel(conn, func(ch *amqp.Channel) error {
		return amqpx.Do(ctx, ch, func() error {
			_, err := ch.QueueDelete(queue, false, false, false) // empty: counted above; quorum queues refuse if-empty (540, closing the connection)
			return err
		})
	})
}

// publishingOf is d to publish again, persistent, with headers (which it may add to): every
// property is kept but two (see warren.Marshaler). The user-id, which the broker refuses
// from another user, goes into a header, unless the headers have one; the expiration is
// dropped (a poison copy's record keeps it, and a held message waits for an operator).
func publishingOf(d amqp.Delivery, headers amqp.Table) amqp.Publishing {
	if _, ok := headers[warren.MetadataUserID]; !ok && d.UserId != "" {
		headers[warren.MetadataUserID] = d.UserId
	}
	return amqp.Publishing{
		Headers: headers, Body: d.Body, MessageId: d.MessageId, ContentType: d.ContentType,
		ContentEncoding: d.ContentEncoding, DeliveryMode: amqp.Persistent, Timestamp: d.Timestamp,
		CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, Type: d.Type, AppId: d.AppId, Priority: d.Priority,
	}
}
