package consumer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
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

// holdsWatch is how often a process reads the held state of a queue for an operator's action
// on its lanes' held keys (see Subscriber.watch).
const holdsWatch = time.Second

// holdsIdleMax is how seldom, at most, a lane whose consumer got no message yet reads the
// held state.
const holdsIdleMax = 30 * time.Second

// laneHolds is what the subscription of a lane of a queue ordered by key knows of its lane's
// held keys (see package held). It is loaded from the held state when a consume session's
// consumer becomes active (its first delivery: the lane's single active consumer gets
// nothing before the previous one's channel is closed, and that one wrote its holds before),
// and kept by this process while it consumes the lane: the lane's keys are held and let go
// only by it.
//
// A message of a held key is parked: published, in the order of the lane, into the lane's
// held queue (topology.HeldQueue), and then acked. An operator's action (package held) is
// carried out by a pass over that queue (see pass), which takes the acted-on keys' messages
// out in order and puts the others back, in their order.
type laneHolds struct {
	queue   string     // the lane's held queue
	mu      sync.Mutex // guards what follows
	keys    map[string]*heldKey
	seq     int64 // counts this process's writes: a read of the state begun before one is stale
	parked  int64 // counts the parks done (confirmed): a pass lets a key go only when none came
	passing bool  // a pass runs
	// active: the session's consumer got its first delivery, and the keys were read then.
	active atomic.Bool

	writing sync.Mutex // the state's writes queued in their order: holds, and lets go (one at a time)
}

type heldKey struct {
	held.Entry
	parking int           // parks in flight
	moved   chan struct{} // closed when a marked message of the key is settled
}

// onHolds runs op, for up to ConnectTimeout, with the publishing connection (see
// consumerconns.Conns), on which the held state is read and written and held messages moved.
func (s *Subscriber) onHolds(op func(ctx context.Context, conn *amqp.Connection) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Connection.ConnectTimeout)
	defer cancel()
	conn, err := s.conns.Publish.Get(ctx)
	if err != nil {
		return err
	}
	return op(ctx, conn)
}

// loadHolds replaces what the subscription knows of its lane's held keys with the state, as
// the session's consumer becomes active (its first delivery, which comes after the previous
// consumer of the lane wrote its holds).
func (sub *subscription) loadHolds() error {
	st, err := sub.s.updateHolds(sub.queue, nil)
	if err != nil {
		return err
	}
	sub.applyHolds(st, 0, true)
	return nil
}

// applyHolds replaces what the subscription knows of its lane's held keys with those of st.
// A state that is not final (read before the session's first delivery, or while watching)
// replaces nothing if the view changed since seq, the view's count when the read began.
func (sub *subscription) applyHolds(st held.State, seq int64, final bool) {
	hs := sub.holds
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if !final && hs.seq != seq {
		return
	}
	keys := map[string]*heldKey{}
	for key, e := range st.Keys {
		if e.Lane != sub.consumed {
			continue
		}
		k := hs.keys[key] // kept: a pass may wait on it (moved), a park count in it
		if k == nil {
			k = &heldKey{}
		}
		k.Entry = e
		keys[key] = k
	}
	hs.keys = keys
	hs.seq++
}

// Hold holds the key of h, whose handler failed for good with cause (see contract.Holder):
// the state first, then this process's view. A key held already is held again by this
// message: an action under way on it stops. The write is queued in the lane's order of
// writes (writing), and waited for outside it: the holds of a lane's other keys, poisoned
// meanwhile, go in the same batch rather than one batch after another. A let-go of the same
// key queued after it removes only the entry of the message it let go (see letGo), so the
// view may take the hold after that let-go has taken the key out of it.
func (h *handout) Hold(cause error) error {
	sub, hs := h.sub, h.sub.holds
	e := held.Entry{Key: h.key, Lane: sub.consumed, Since: time.Now().UTC(), MessageID: h.msg.UUID,
		Error: cause.Error(), Handler: sub.s.cfg.HandlerName}
	hs.writing.Lock()
	op := sub.s.queueHolds(sub.queue, func(st *held.State) bool {
		if old, ok := st.Keys[h.key]; ok {
			e.Since = old.Since
		}
		st.Keys[h.key] = e
		return true
	})
	hs.writing.Unlock()
	if _, err := sub.s.awaitHolds(sub.queue, op); err != nil {
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
	return nil
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

// park publishes h's delivery into the lane's held queue and acks it; if it cannot, the session
// ends and the delivery goes back to the lane with the channel, in order (see keyGate). Its
// expiration is not kept: a held message waits for an operator.
func (sub *subscription) park(h *handout) {
	err := sub.s.onHolds(func(ctx context.Context, conn *amqp.Connection) error {
		return statequeue.OnChannel(conn, func(ch *amqp.Channel) error {
			headers := amqp.Table{}
			maps.Copy(headers, h.raw.Headers)
			return amqpx.PublishConfirmed(ctx, ch, "", sub.holds.queue, true, publishingOf(*h.raw, headers))
		})
	})
	hs := sub.holds
	hs.mu.Lock()
	if k := hs.keys[h.key]; k != nil {
		k.parking--
	}
	if err == nil {
		hs.parked++
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

// movedSettled is told that a marked message of key was settled: the pass moves the next.
func (hs *laneHolds) movedSettled(key string) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if k := hs.keys[key]; k != nil && k.moved != nil {
		close(k.moved)
		k.moved = nil
	}
}

// passIfActed starts a pass (see pass) when an operator acted on one of the lane's held keys
// and no pass runs.
func (sub *subscription) passIfActed(cs *channelState) {
	hs := sub.holds
	hs.mu.Lock()
	defer hs.mu.Unlock()
	acted := false
	for _, k := range hs.keys {
		acted = acted || k.Action != ""
	}
	if acted && !hs.passing {
		hs.passing = true
		go sub.pass(cs)
	}
}

// pass carries out the operator's actions on the lane's held keys (see laneHolds) in one
// pass over the lane's held queue, and lets the keys go whose messages are all out of it,
// unless the session stops first (the next owner of the lane takes over from the state).
func (sub *subscription) pass(cs *channelState) {
	hs := sub.holds
	fields := watermill.LogFields{"queue": sub.queue, "lane": sub.consumed}
	let, err := sub.passOver(cs)
	hs.mu.Lock()
	hs.passing = false
	hs.mu.Unlock()
	for _, key := range let {
		sub.s.logger.Info("Held key let go", watermill.LogFields{"queue": sub.queue, "lane": sub.consumed, "key": key})
	}
	if err != nil {
		sub.s.logger.Error("Held keys not all released or skipped: tried again", err, fields)
	}
}

// passOver consumes the lane's held queue, in order, and publishes a marker into it; once
// the marker comes back it has seen everything parked before it. The keys whose action was
// asked when it began are acted on: a released one's messages are moved back into the lane
// one at a time, each once the one before it is settled, a skipped one's poisoned; the
// others' messages stay unacknowledged, and the consumer's channel closes at the end, which
// puts them back in their order, ahead of what was parked meanwhile. Gets would not: a
// quorum queue returned 200 messages got one by one, by a nack or a close, out of order,
// while those a consumer held came back in order (measured on RabbitMQ 3.10.8 and 4.0.5,
// docs/decisions.md). The held queue's single active consumer keeps two passes (of a
// lane changing hands) apart. A key held again meanwhile (its action withdrawn) is no longer
// acted on: its later messages go back too. It returns the keys it let go.
func (sub *subscription) passOver(cs *channelState) (let []string, err error) {
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
	conn, err := sub.s.conns.Publish.Get(ctx)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel() // consumes; its close returns what was kept
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	pubCh, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	defer pubCh.Close()
	confirmer, err := amqpx.NewConfirmer(pubCh)
	if err != nil {
		return nil, err
	}
	pub := func(queue string, p amqp.Publishing) error { // confirmed, and not returned
		f, err := confirmer.Publish(ctx, "", queue, true, p)
		if err != nil {
			return err
		}
		return f.Wait(ctx)
	}
	acted := map[string]string{} // the keys acted on, by what was asked when the pass began
	hs.mu.Lock()
	for key, k := range hs.keys {
		if k.Action != "" {
			acted[key] = k.Action
		}
	}
	hs.mu.Unlock()
	var deliveries <-chan amqp.Delivery
	if err := amqpx.Do(ctx, ch, func() (err error) {
		deliveries, err = ch.Consume(hs.queue, "", false, false, false, false, nil)
		return err
	}); err != nil {
		return nil, err
	}
	marker, parked := "", int64(0)
	mark := func() error {
		hs.mu.Lock()
		parked = hs.parked
		hs.mu.Unlock()
		marker = statequeue.NewID()
		return pub(hs.queue, amqp.Publishing{Headers: amqp.Table{contract.HeldMarkerHeader: marker}, DeliveryMode: amqp.Persistent})
	}
	if err := mark(); err != nil {
		return nil, err
	}
	for {
		var d amqp.Delivery
		var ok bool
		select {
		case d, ok = <-deliveries:
		case <-ctx.Done():
			return let, ctx.Err()
		}
		if !ok {
			return let, errors.New("the held queue's channel closed")
		}
		if m, isMarker := d.Headers[contract.HeldMarkerHeader]; isMarker {
			if err := d.Ack(false); err != nil {
				return let, err
			}
			if m != marker { // a pass's that ended before its marker came back
				continue
			}
			done, more := sub.letGo(acted, parked)
			let = append(let, done...)
			if !more {
				return let, nil
			}
			if err := mark(); err != nil { // a park in flight: its message comes before the next marker
				return let, err
			}
			continue
		}
		key, _ := d.Headers[warren.MetadataOrderKey].(string)
		hs.mu.Lock()
		k := hs.keys[key]
		action, ok := acted[key]
		if ok && (k == nil || k.Action != action) { // held again, or let go: its action is over
			delete(acted, key)
			action = ""
		}
		var entry held.Entry
		if k != nil {
			entry = k.Entry
		}
		hs.mu.Unlock()
		switch action {
		case held.Release:
			err = sub.moveBack(pub, d, key)
		case held.Skip:
			err = sub.poisonSkipped(pub, d, entry)
		default:
			continue // kept: back in order when ch closes
		}
		if err == nil {
			err = d.Ack(false)
		}
		if err == nil && action == held.Release {
			err = sub.awaitMoved(ctx, key)
		}
		if err != nil {
			return let, err
		}
	}
}

// moveBack publishes d into the lane, marked, and has the key wait for it (see awaitMoved).
func (sub *subscription) moveBack(pub func(string, amqp.Publishing) error, d amqp.Delivery, key string) error {
	hs := sub.holds
	hs.mu.Lock()
	if k := hs.keys[key]; k != nil {
		k.moved = make(chan struct{})
	}
	hs.mu.Unlock()
	headers := amqp.Table{contract.ReleasedHeader: true}
	maps.Copy(headers, d.Headers)
	return pub(sub.consumed, publishingOf(d, headers))
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
func (sub *subscription) poisonSkipped(pub func(string, amqp.Publishing) error, d amqp.Delivery, e held.Entry) error {
	headers := withoutBookkeeping(d.Headers)
	now := time.Now()
	warren.PoisonRecord{
		Error: fmt.Sprintf("its order key %q was held since %s behind message %s (%s), and skipped", e.Key,
			e.Since.Format(time.RFC3339), e.MessageID, e.Error),
		Reason: warren.PoisonReasonSkipped, Handler: sub.s.cfg.HandlerName, Queue: sub.queue,
		Origin:   &warren.Origin{RoutingKey: sub.consumed},
		Attempts: 0, FirstFailure: now, LastFailure: now, TraceID: traceID(d.Headers),
	}.EncodeTable(headers)
	return pub(topology.PoisonQueue(sub.queue), publishingOf(d, headers))
}

// letGo lets go each acted-on key whose messages are all out of the held queue: none is being
// parked, and no park was done since parked was read, before the marker that came back was
// published. This process's view first (what comes after is handled as it comes), then the state. It
// returns the keys let go, and whether an acted-on key is left (a park in flight).
func (sub *subscription) letGo(acted map[string]string, parked int64) (let []string, more bool) {
	hs := sub.holds
	hs.writing.Lock()
	defer hs.writing.Unlock()
	hs.mu.Lock()
	gone := map[string]string{} // key: the poisoned message that held it
	for key, action := range acted {
		k := hs.keys[key]
		switch {
		case k == nil || k.Action != action:
			delete(acted, key) // held again, or let go
		case k.parking > 0 || hs.parked != parked:
			more = true
		default:
			gone[key] = k.MessageID
			delete(hs.keys, key)
			delete(acted, key)
		}
	}
	if len(gone) > 0 {
		hs.seq++
	}
	hs.mu.Unlock()
	if len(gone) == 0 {
		return nil, more
	}
	_, err := sub.s.updateHolds(sub.queue, func(st *held.State) bool {
		changed := false
		for key, id := range gone {
			if e, ok := st.Keys[key]; ok && e.MessageID == id {
				delete(st.Keys, key)
				changed = true
			}
		}
		return changed
	})
	if err != nil {
		// Let go here; the state still holds them: the next owner of the lane, or the next
		// read, parks their messages and passes again.
		sub.s.logger.Error("Held keys let go, and still held in the state", err, watermill.LogFields{"queue": sub.queue, "lane": sub.consumed})
	}
	for key := range gone {
		let = append(let, key)
	}
	return let, more
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
