package memrabbit

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"
)

// The broker's operations on its exchanges and queues, called with its lock held.

// declareExchangeLocked declares an exchange, or checks one that exists against m.
func (b *Broker) declareExchangeLocked(m *exchangeDeclare) error {
	x, ok := b.exchanges[m.Exchange]
	if m.Passive {
		if !ok {
			return channelErr(NotFound, "NOT_FOUND - no exchange '%s' in vhost '/'", m.Exchange)
		}
		return nil
	}
	if m.Exchange == "" || strings.HasPrefix(m.Exchange, "amq.") && !ok {
		return channelErr(AccessRefused, "ACCESS_REFUSED - exchange name '%s' contains reserved prefix 'amq.*'", m.Exchange)
	}
	switch m.Type {
	case "direct", "fanout", "topic", "headers":
	default:
		if b.atLeast(4, 0) { // a channel error there, a connection error on 3.10
			return channelErr(PreconditionFailed, "PRECONDITION_FAILED - unknown exchange type '%s'", m.Type)
		}
		return &errConnection{code: CommandInvalid, text: fmt.Sprintf("COMMAND_INVALID - unknown exchange type '%s'", m.Type)}
	}
	if ok {
		return exchangeInequivalence(x, m)
	}
	b.exchanges[m.Exchange] = &exchange{name: m.Exchange, kind: m.Type, durable: m.Durable, autoDelete: m.AutoDelete,
		internal: m.Internal, args: m.Arguments}
	return nil
}

// deleteExchange deletes an exchange (one that does not exist is no error, as on RabbitMQ
// 3.10 and later).
func (b *Broker) deleteExchange(m *exchangeDelete) error {
	x, ok := b.exchanges[m.Exchange]
	if !ok {
		return nil
	}
	if m.Exchange == "" {
		return channelErr(AccessRefused, "ACCESS_REFUSED - operation not permitted on the default exchange")
	}
	if strings.HasPrefix(m.Exchange, "amq.") {
		return channelErr(AccessRefused, "ACCESS_REFUSED - deletion of system exchange '%s' in vhost '/' not allowed", m.Exchange)
	}
	if m.IfUnused && len(x.bindings) > 0 {
		return channelErr(PreconditionFailed, "PRECONDITION_FAILED - exchange '%s' in vhost '/' in use", m.Exchange)
	}
	delete(b.exchanges, m.Exchange)
	for _, other := range b.exchanges {
		other.bindings = slices.DeleteFunc(other.bindings, func(bd binding) bool { return bd.toExchange && bd.queue == m.Exchange })
	}
	return nil
}

// declareQueueLocked declares a queue for c, or checks one that exists against m.
func (b *Broker) declareQueueLocked(c *conn, m *queueDeclare) (*queueDeclareOk, error) {
	name := m.Queue
	if name == "" && !m.Passive {
		b.seq++
		name = fmt.Sprintf("amq.gen-%08d", b.seq)
	}
	q, ok := b.queues[name]
	if ok && q.exclusive != nil && q.exclusive != c {
		return nil, lockedErr(name)
	}
	if m.Passive {
		if !ok {
			return nil, channelErr(NotFound, "NOT_FOUND - no queue '%s' in vhost '/'", name)
		}
		return &queueDeclareOk{Queue: name, MessageCount: uint32(len(q.ready)), ConsumerCount: uint32(len(q.consumers))}, nil
	}
	if err := b.argsRefusal(name, m.Arguments); err != nil {
		return nil, err
	}
	if strings.HasPrefix(name, "amq.") && !ok && m.Queue != "" {
		return nil, channelErr(AccessRefused, "ACCESS_REFUSED - queue name '%s' contains reserved prefix 'amq.*'", name)
	}
	if ok {
		if err := queueInequivalence(q, m); err != nil {
			return nil, err
		}
		b.touchLocked(q)
		return &queueDeclareOk{Queue: name, MessageCount: uint32(len(q.ready)), ConsumerCount: uint32(len(q.consumers))}, nil
	}
	if err := quorumRefusal(name, m); err != nil {
		return nil, err
	}
	q = b.newQueue(name, m.Durable, m.AutoDelete, m.Arguments)
	if m.Exclusive {
		q.exclusive = c
	}
	b.queues[name] = q
	b.touchLocked(q)
	return &queueDeclareOk{Queue: name}, nil
}

// quorumRefusal is the refusal of a new quorum queue declared with what only a classic queue
// has: not durable, auto-delete or exclusive (its arguments: argsRefusal).
func quorumRefusal(name string, m *queueDeclare) error {
	if m.Arguments["x-queue-type"] != "quorum" {
		return nil
	}
	property := ""
	switch {
	case !m.Durable:
		property = "non-durable"
	case m.AutoDelete:
		property = "auto-delete"
	case m.Exclusive:
		property = "exclusive-owner"
	default:
		return nil
	}
	return channelErr(PreconditionFailed, "PRECONDITION_FAILED - invalid property '%s' for queue '%s' in vhost '/'", property, name)
}

// queueFor returns the queue name, which c may use.
func (b *Broker) queueFor(c *conn, name string) (*queue, error) {
	q, ok := b.queues[name]
	if !ok {
		return nil, channelErr(NotFound, "NOT_FOUND - no queue '%s' in vhost '/'", name)
	}
	if q.exclusive != nil && q.exclusive != c {
		return nil, lockedErr(name)
	}
	return q, nil
}

// bindLocked binds (or unbinds) a queue, or an exchange (toExchange), to exchange.
func (b *Broker) bindLocked(c *conn, dest, exchangeName, key string, args Table, bind, toExchange bool) error {
	_, destExists := b.exchanges[dest]
	if !toExchange {
		_, destExists = b.queues[dest]
	}
	x, ok := b.exchanges[exchangeName]
	if !bind && (!ok || !destExists) {
		return nil // unbinding what is not there is done
	}
	if toExchange {
		if !destExists {
			return channelErr(NotFound, "NOT_FOUND - no exchange '%s' in vhost '/'", dest)
		}
	} else if _, err := b.queueFor(c, dest); err != nil {
		return err
	}
	if !ok {
		return channelErr(NotFound, "NOT_FOUND - no exchange '%s' in vhost '/'", exchangeName)
	}
	if x.kind == "headers" && bind {
		if err := xMatchRefusal(args); err != nil {
			return err
		}
	}
	if exchangeName == "" || toExchange && dest == "" {
		return channelErr(AccessRefused, "ACCESS_REFUSED - operation not permitted on the default exchange")
	}
	i := -1
	for j, bd := range x.bindings {
		if bd.queue == dest && bd.toExchange == toExchange && bd.key == key && sameArgs(bd.args, args) {
			i = j
		}
	}
	switch {
	case bind && i < 0:
		x.bindings = append(x.bindings, newBinding(dest, toExchange, key, args))
	case !bind && i >= 0:
		x.bindings = append(x.bindings[:i], x.bindings[i+1:]...)
		b.autoDeleteExchangeLocked(x)
	}
	return nil
}

// sameArgs reports whether two bindings' arguments are the same (see sameArg).
func sameArgs(a, b Table) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		w, ok := b[k]
		if !ok || !sameArg(v, w) {
			return false
		}
	}
	return true
}

// sameArg reports whether two values of an argument are the same, as RabbitMQ compares
// declarations: integers of any width by their value, the rest by type and value.
func sameArg(a, b any) bool {
	an, aInt := intArg(a)
	bn, bInt := intArg(b)
	if aInt || bInt {
		return aInt && bInt && an == bn
	}
	return reflect.DeepEqual(a, b)
}

// autoDeleteExchangeLocked deletes an auto-delete exchange that lost its last binding.
func (b *Broker) autoDeleteExchangeLocked(x *exchange) {
	if x.autoDelete && len(x.bindings) == 0 {
		delete(b.exchanges, x.name)
	}
}

// deleteQueueChecked deletes a queue as queue.delete asks, and returns how many messages it
// held.
func (b *Broker) deleteQueueChecked(c *conn, m *queueDelete) (int, error) {
	q, ok := b.queues[m.Queue]
	if !ok {
		return 0, nil
	}
	if _, err := b.queueFor(c, m.Queue); err != nil {
		return 0, err
	}
	if q.quorum && (m.IfUnused || m.IfEmpty) { // measured on 3.10.8 and 4.0.5
		return 0, &errConnection{code: NotImplemented, text: "NOT_IMPLEMENTED - if_unused and if_empty are not supported by quorum queues"}
	}
	if m.IfUnused && len(q.consumers) > 0 {
		return 0, channelErr(PreconditionFailed, "PRECONDITION_FAILED - queue '%s' in vhost '/' in use", m.Queue)
	}
	if m.IfEmpty && len(q.ready) > 0 {
		return 0, channelErr(PreconditionFailed, "PRECONDITION_FAILED - queue '%s' in vhost '/' is not empty", m.Queue)
	}
	n := len(q.ready)
	b.deleteQueueLocked(m.Queue)
	return n, nil
}

// deleteQueueLocked deletes a queue: its consumers are cancelled (the broker tells their
// channels), its bindings go.
func (b *Broker) deleteQueueLocked(name string) {
	q, ok := b.queues[name]
	if !ok {
		return
	}
	delete(b.queues, name)
	b.setExpiryLocked(q, time.Time{})
	if q.unused != nil {
		q.unused.Stop()
	}
	for _, cs := range q.consumers {
		delete(cs.ch.consumers, cs.tag)
		cs.ch.c.sendMethod(cs.ch.id, &basicCancel{ConsumerTag: cs.tag, NoWait: true})
	}
	q.consumers = nil
	b.unconsumedLocked(q)
	for _, x := range b.exchanges {
		kept := x.bindings[:0]
		for _, bd := range x.bindings {
			if bd.toExchange || bd.queue != name {
				kept = append(kept, bd)
			}
		}
		if len(kept) != len(x.bindings) {
			x.bindings = kept
			b.autoDeleteExchangeLocked(x)
		}
	}
}

// publishLocked routes msg from its exchange to queues, and reports whether any took it,
// and whether one refused it (x-overflow reject-publish: the publish is nacked).
func (b *Broker) publishLocked(msg *stored, more []string) (routed, refused bool) {
	var queues []*queue
	if to, ok := b.replies[msg.routingKey]; ok && msg.exchange == "" {
		to.lastTag++
		to.c.sendMethod(to.id, &basicDeliver{ConsumerTag: to.reply.tag, DeliveryTag: to.lastTag,
			RoutingKey: msg.routingKey, Properties: msg.props, Body: msg.body})
		return true, false
	}
	if x, ok := b.exchanges[msg.exchange]; ok {
		queues = b.routeLocked(x, msg.routingKey, more, &msg.props)
	}
	b.recordLocked("published", msg, "", "")
	for _, q := range queues {
		if !b.enqueueLocked(q, msg) {
			refused = true
		}
	}
	b.dispatchLocked()
	return len(queues) > 0, refused
}

// requeueLocked returns deliveries to their queues (see returnLocked), in their order:
// requeued by the client, or left by a closed channel.
func (b *Broker) requeueLocked(ds []*delivery, requeued bool) {
	for _, d := range ds {
		b.returnLocked(d.q, d.qd, requeued)
	}
}

// rejectLocked dead-letters deliveries nacked or rejected without requeue.
func (b *Broker) rejectLocked(ds []*delivery) {
	for _, d := range ds {
		if b.queues[d.q.name] != d.q || d.q.stream {
			continue // deleted; or a stream, which keeps them all
		}
		b.deadLetterLocked(d.q, d.qd, "rejected")
		b.armExpiryLocked(d.q)
	}
}

// dispatchLocked delivers what the queues hold to their consumers, round robin, as far as
// their channels' prefetch lets them.
func (b *Broker) dispatchLocked() {
	for {
		before, now := b.enqueued, time.Now()
		for _, q := range b.consumed {
			b.dispatchQueueLocked(q, now)
		}
		if b.enqueued == before {
			return
		}
		// A head due as it came up was dead-lettered, maybe to a queue already passed.
	}
}

// dispatchQueueLocked delivers what q holds to its consumers (see dispatchLocked); a message
// due by now, as it comes next, is dead-lettered instead.
func (b *Broker) dispatchQueueLocked(q *queue, now time.Time) {
	if q.stream {
		b.readStreamLocked(q)
		return
	}
	delivered := false
	for {
		b.expireLocked(q, now)
		if len(q.ready) == 0 {
			break
		}
		cs := q.nextConsumer()
		if cs == nil {
			break
		}
		b.deliverLocked(q, cs, q.take())
		delivered = true
	}
	if delivered {
		b.armExpiryLocked(q) // a new head
	}
}

// deliverLocked delivers qd, taken from q, to consumer cs.
func (b *Broker) deliverLocked(q *queue, cs *consumer, qd *queued) {
	tag := cs.ch.track(q, qd, cs, cs.noAck)
	b.recordLocked("delivered", qd.msg, q.name, "")
	cs.ch.c.sendMethod(cs.ch.id, &basicDeliver{ConsumerTag: cs.tag, DeliveryTag: tag, Redelivered: qd.redelivered,
		Exchange: qd.msg.exchange, RoutingKey: qd.msg.routingKey, Properties: deliveredProps(qd), Body: qd.msg.body})
}

// unconsumedLocked takes q, which lost its last consumer, from the queues dispatchLocked
// delivers from.
func (b *Broker) unconsumedLocked(q *queue) {
	b.consumed = slices.DeleteFunc(b.consumed, func(o *queue) bool { return o == q })
}

// deliveredProps are the properties qd is delivered with: a quorum queue tells how often it
// was returned (x-delivery-count).
func deliveredProps(qd *queued) properties {
	p := qd.msg.props
	if qd.deliveries > 0 {
		p = withHeader(p, "x-delivery-count", int64(qd.deliveries))
	}
	return p
}

// nextConsumer returns the next consumer whose channel has room: of those, one of the highest
// priority (x-priority), round robin; with a single active consumer, only the first (on a
// quorum queue of 4.0, the first of the highest priority).
func (q *queue) nextConsumer() *consumer {
	if q.single {
		if len(q.consumers) == 0 {
			return nil
		}
		if q.quorum4 {
			// The first of the highest priority takes over once the active one has nothing
			// unacked; till then, neither gets more.
			top := 0
			for i, cs := range q.consumers {
				if cs.priority > q.consumers[top].priority {
					top = i
				}
			}
			if top > 0 {
				if q.consumers[0].unacked > 0 {
					return nil
				}
				cs := q.consumers[top]
				q.consumers = slices.Insert(slices.Delete(q.consumers, top, top+1), 0, cs)
			}
		}
		if q.consumers[0].room() {
			return q.consumers[0]
		}
		return nil
	}
	// Round robin from q.next among the consumers of the highest priority that have room.
	best := -1
	for i := range q.consumers {
		j := (q.next + i) % len(q.consumers)
		if cs := q.consumers[j]; cs.room() && (best < 0 || cs.priority > q.consumers[best].priority) {
			best = j
		}
	}
	if best < 0 {
		return nil
	}
	q.next = (best + 1) % len(q.consumers)
	return q.consumers[best]
}

// readStreamLocked delivers to each consumer of stream q what it has not read, as far as its
// channel's prefetch lets it, each with its offset (x-stream-offset).
func (b *Broker) readStreamLocked(q *queue) {
	for _, cs := range q.consumers {
		for cs.offset < len(q.log) && cs.room() {
			msg := q.log[cs.offset]
			p := withHeader(msg.props, "x-stream-offset", int64(cs.offset))
			tag := cs.ch.track(q, &queued{msg: msg}, cs, false)
			cs.ch.c.sendMethod(cs.ch.id, &basicDeliver{ConsumerTag: cs.tag, DeliveryTag: tag,
				Exchange: msg.exchange, RoutingKey: msg.routingKey, Properties: p, Body: msg.body})
			cs.offset++
		}
	}
}
