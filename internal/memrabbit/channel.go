package memrabbit

import (
	"fmt"
	"slices"
	"strconv"
	"time"
)

// channel is a channel of a connection. Its state is read and written under the broker's
// lock.
type channel struct {
	c       *conn
	id      uint16
	closing bool // the broker sent channel.close and waits for close-ok

	confirming bool
	confirmed  uint64 // publishes since confirm.select: the last confirm's tag

	// In a transaction (tx.select), publishes and settlements wait for tx.commit; tx.rollback
	// and the channel's close drop them, and the deliveries settled are unacked again.
	tx      bool
	pending []pending

	publishing *basicPublish // waiting for its header and body
	size       uint64
	content    []byte

	reply     *consumer // consumes amq.rabbitmq.reply-to: its address is replyTo
	replyTo   string
	prefetch  int // basic.qos: each new consumer's (0: unlimited)
	global    int // basic.qos global: the channel's, all consumers together (0: unlimited)
	consumers map[string]*consumer
	unacked   map[uint64]*delivery
	tags      []uint64 // the unacked delivery tags, in order
	lastTag   uint64
}

// consumer consumes a queue on a channel.
type consumer struct {
	tag       string
	ch        *channel
	queue     *queue
	noAck     bool
	exclusive bool
	offset    int // of a stream's consumer: the next message of its log it reads
	prefetch  int // the channel's basic.qos when it started (0: unlimited)
	unacked   int // its deliveries not yet settled
	priority  int // x-priority: a queue delivers to its highest that has room
}

// room reports whether the consumer may take another delivery: its own prefetch and its
// channel's global one allow it.
func (cs *consumer) room() bool {
	ch := cs.ch
	if cs.noAck {
		return !ch.closing
	}
	return !ch.closing && (cs.prefetch == 0 || cs.unacked < cs.prefetch) && (ch.global == 0 || len(ch.tags) < ch.global)
}

// pending is a publish, or a settlement of deliveries (their tags and what they were), that
// waits for its transaction's commit.
type pending struct {
	msg       *stored
	more      []string // the publish's further routing keys (CC, BCC)
	mandatory bool

	tags          []uint64
	ds            []*delivery
	nack, requeue bool
}

// delivery is a message delivered on a channel, not yet settled: by cs (nil for basic.get).
type delivery struct {
	q  *queue
	qd *queued
	cs *consumer
}

func newChannel(c *conn, id uint16) *channel {
	return &channel{c: c, id: id, consumers: map[string]*consumer{}, unacked: map[uint64]*delivery{}}
}

// errChannel is a channel error: the broker closes the channel with it.
type errChannel struct {
	code uint16
	text string
}

func (e *errChannel) Error() string { return fmt.Sprintf("channel error %d: %s", e.code, e.text) }

func channelErr(code uint16, format string, args ...any) error {
	return &errChannel{code: code, text: replyText(fmt.Sprintf(format, args...))}
}

// replyText is text as RabbitMQ sends it in a close: at most 255 bytes, a longer one cut to
// 252 and "...".
func replyText(text string) string {
	if len(text) > 255 {
		return text[:252] + "..."
	}
	return text
}

// method handles a method of the channel, holding the broker's lock. A channel error closes
// the channel; a connection error is returned.
func (ch *channel) method(m message) error {
	classID, methodID := m.id()
	return ch.failed(ch.do(m), classID, methodID)
}

// failed closes the channel on a channel error err of the method classID, methodID; it
// returns a connection error, and nil for the rest.
func (ch *channel) failed(err error, classID, methodID uint16) error {
	if ce, ok := err.(*errChannel); ok {
		ch.closeLocked()
		ch.closing = true
		ch.c.sendMethod(ch.id, &channelClose{ReplyCode: ce.code, ReplyText: ce.text, ClassId: classID, MethodId: methodID})
		return nil
	}
	return err
}

func (ch *channel) do(m message) error {
	b := ch.c.b
	if ch.publishing != nil {
		return &errConnection{code: CommandInvalid, text: "COMMAND_INVALID - expected content header"}
	}
	switch m := m.(type) {
	case *channelClose:
		ch.closeLocked()
		delete(ch.c.channels, ch.id)
		ch.c.sendMethod(ch.id, &channelCloseOk{})
	case *channelFlow:
		if !m.Active { // RabbitMQ does not stop a channel's deliveries on request
			return &errConnection{code: NotImplemented, text: "NOT_IMPLEMENTED - active=false"}
		}
		ch.c.sendMethod(ch.id, &channelFlowOk{Active: m.Active})
	case *basicQos:
		if m.PrefetchSize != 0 {
			return &errConnection{code: NotImplemented, text: fmt.Sprintf("NOT_IMPLEMENTED - prefetch_size!=0 (%d)", m.PrefetchSize)}
		}
		if m.Global {
			ch.global = int(m.PrefetchCount)
		} else {
			ch.prefetch = int(m.PrefetchCount)
		}
		ch.c.sendMethod(ch.id, &basicQosOk{})
		b.dispatchLocked()
	case *confirmSelect:
		if ch.tx {
			return channelErr(PreconditionFailed, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")
		}
		ch.confirming = true
		if !m.Nowait {
			ch.c.sendMethod(ch.id, &confirmSelectOk{})
		}
	case *exchangeDeclare:
		if err := b.declareExchangeLocked(m); err != nil {
			return err
		}
		if !m.NoWait {
			ch.c.sendMethod(ch.id, &exchangeDeclareOk{})
		}
	case *exchangeDelete:
		if err := b.deleteExchange(m); err != nil {
			return err
		}
		if !m.NoWait {
			ch.c.sendMethod(ch.id, &exchangeDeleteOk{})
		}
	case *queueDeclare:
		ok, err := b.declareQueueLocked(ch.c, m)
		if err != nil {
			return err
		}
		if !m.NoWait {
			ch.c.sendMethod(ch.id, ok)
		}
	case *exchangeBind:
		if err := b.bindLocked(ch.c, m.Destination, m.Source, m.RoutingKey, m.Arguments, true, true); err != nil {
			return err
		}
		if !m.NoWait {
			ch.c.sendMethod(ch.id, &exchangeBindOk{})
		}
	case *exchangeUnbind:
		if err := b.bindLocked(ch.c, m.Destination, m.Source, m.RoutingKey, m.Arguments, false, true); err != nil {
			return err
		}
		if !m.NoWait {
			ch.c.sendMethod(ch.id, &exchangeUnbindOk{})
		}
	case *queueBind:
		if err := b.bindLocked(ch.c, m.Queue, m.Exchange, m.RoutingKey, m.Arguments, true, false); err != nil {
			return err
		}
		if !m.NoWait {
			ch.c.sendMethod(ch.id, &queueBindOk{})
		}
	case *queueUnbind:
		if err := b.bindLocked(ch.c, m.Queue, m.Exchange, m.RoutingKey, m.Arguments, false, false); err != nil {
			return err
		}
		ch.c.sendMethod(ch.id, &queueUnbindOk{})
	case *queuePurge:
		q, err := b.queueFor(ch.c, m.Queue)
		if err != nil {
			return err
		}
		n := len(q.ready)
		q.clear()
		if !m.NoWait {
			ch.c.sendMethod(ch.id, &queuePurgeOk{MessageCount: uint32(n)})
		}
	case *queueDelete:
		n, err := b.deleteQueueChecked(ch.c, m)
		if err != nil {
			return err
		}
		if !m.NoWait {
			ch.c.sendMethod(ch.id, &queueDeleteOk{MessageCount: uint32(n)})
		}
	case *basicPublish:
		x, ok := b.exchanges[m.Exchange]
		if !ok {
			return channelErr(NotFound, "NOT_FOUND - no exchange '%s' in vhost '/'", m.Exchange)
		}
		if x.internal {
			return channelErr(AccessRefused, "ACCESS_REFUSED - cannot publish to internal exchange '%s' in vhost '/'", m.Exchange)
		}
		if m.Immediate {
			return &errConnection{code: NotImplemented, text: "NOT_IMPLEMENTED - immediate=true"}
		}
		ch.publishing, ch.size, ch.content = m, 0, nil
	case *basicConsume:
		return ch.consume(m)
	case *basicCancel:
		if cs := ch.consumers[m.ConsumerTag]; cs != nil {
			ch.cancelLocked(cs)
		}
		if !m.NoWait {
			ch.c.sendMethod(ch.id, &basicCancelOk{ConsumerTag: m.ConsumerTag})
		}
	case *basicGet:
		return ch.get(m)
	case *basicAck:
		return ch.settle(m.DeliveryTag, m.Multiple, false, false)
	case *basicNack:
		return ch.settle(m.DeliveryTag, m.Multiple, true, m.Requeue)
	case *basicReject:
		return ch.settle(m.DeliveryTag, false, true, m.Requeue)
	case *basicRecover:
		ch.requeueAllLocked(true)
		ch.c.sendMethod(ch.id, &basicRecoverOk{})
		b.dispatchLocked()
	case *txSelect:
		if ch.confirming {
			return channelErr(PreconditionFailed, "PRECONDITION_FAILED - cannot switch from confirm to tx mode")
		}
		ch.tx = true
		ch.c.sendMethod(ch.id, &txSelectOk{})
	case *txCommit:
		if !ch.tx {
			return channelErr(PreconditionFailed, "PRECONDITION_FAILED - channel is not transactional")
		}
		ch.commit()
		ch.c.sendMethod(ch.id, &txCommitOk{})
	case *txRollback:
		if !ch.tx {
			return channelErr(PreconditionFailed, "PRECONDITION_FAILED - channel is not transactional")
		}
		ch.rollback()
		ch.c.sendMethod(ch.id, &txRollbackOk{})
	default:
		return &errConnection{code: NotImplemented, text: fmt.Sprintf("NOT_IMPLEMENTED - %T", m)}
	}
	return nil
}

// header starts the content of the message being published.
func (ch *channel) header(f *headerFrame) error {
	if ch.publishing == nil {
		return &errConnection{code: CommandInvalid, text: "COMMAND_INVALID - unexpected content header"}
	}
	ch.publishing.Properties = f.Properties
	ch.size = f.Size
	if max := ch.c.b.maxMessageSize(); f.Size > max {
		return channelErr(PreconditionFailed, "PRECONDITION_FAILED - message size %d is larger than configured max size %d", f.Size, max)
	}
	if ch.size == 0 {
		return ch.publish()
	}
	return nil
}

// body adds a body frame to the message being published.
func (ch *channel) body(p []byte) error {
	if ch.publishing == nil {
		return &errConnection{code: CommandInvalid, text: "COMMAND_INVALID - unexpected content body"}
	}
	ch.content = append(ch.content, p...)
	if uint64(len(ch.content)) >= ch.size {
		return ch.publish()
	}
	return nil
}

// publish routes the message whose content is complete (see route); in a transaction, at its
// commit.
func (ch *channel) publish() error {
	m := ch.publishing
	ch.publishing = nil
	msg := &stored{exchange: m.Exchange, routingKey: m.RoutingKey, props: m.Properties, body: ch.content}
	ch.content = nil
	if err := expirationRefusal(msg.props.Expiration); err != nil {
		return err
	}
	more, err := headerRoutes(&msg.props)
	if err != nil {
		return err
	}
	if msg.props.ReplyTo == directReplyTo {
		if ch.reply == nil {
			return channelErr(PreconditionFailed, "PRECONDITION_FAILED - fast reply consumer does not exist")
		}
		msg.props.ReplyTo = ch.replyTo
	}
	if ch.tx {
		ch.pending = append(ch.pending, pending{msg: msg, more: more, mandatory: m.Mandatory})
		return nil
	}
	ch.route(msg, more, m.Mandatory)
	return nil
}

// route routes a message published on the channel, returns it when it is mandatory and went
// nowhere, and confirms it.
func (ch *channel) route(msg *stored, more []string, mandatory bool) {
	routed, refused := ch.c.b.publishLocked(msg, more)
	if !routed && mandatory {
		ch.c.sendMethod(ch.id, &basicReturn{ReplyCode: NoRoute, ReplyText: "NO_ROUTE", Exchange: msg.exchange,
			RoutingKey: msg.routingKey, Properties: msg.props, Body: msg.body})
	}
	if ch.confirming {
		ch.confirmed++
		if refused {
			ch.c.sendMethod(ch.id, &basicNack{DeliveryTag: ch.confirmed})
		} else {
			ch.c.sendMethod(ch.id, &basicAck{DeliveryTag: ch.confirmed})
		}
	}
}

// commit carries out the transaction's publishes, then its settlements.
func (ch *channel) commit() {
	done := ch.pending
	ch.pending = nil
	for _, p := range done {
		if p.msg != nil {
			ch.route(p.msg, p.more, p.mandatory)
		}
	}
	for _, p := range done {
		if p.msg == nil {
			ch.settled(p.ds, p.nack, p.requeue)
		}
	}
}

// rollback drops the transaction's publishes and settlements: the deliveries are unacked
// again.
func (ch *channel) rollback() {
	for _, p := range ch.pending {
		for i, t := range p.tags {
			ch.unacked[t] = p.ds[i]
			ch.tags = append(ch.tags, t)
		}
	}
	slices.Sort(ch.tags)
	ch.pending = nil
}

// consume adds a consumer.
func (ch *channel) consume(m *basicConsume) error {
	b := ch.c.b
	if m.Queue == directReplyTo {
		return ch.consumeReplies(m)
	}
	q, err := b.queueFor(ch.c, m.Queue)
	if err != nil {
		return err
	}
	tag := m.ConsumerTag
	if tag == "" {
		b.seq++
		tag = fmt.Sprintf("amq.ctag-%d", b.seq)
	}
	if ch.consumers[tag] != nil {
		return &errConnection{code: NotAllowed, text: fmt.Sprintf("NOT_ALLOWED - attempt to reuse consumer tag '%s'", tag)}
	}
	for _, other := range q.consumers {
		if other.exclusive {
			return channelErr(AccessRefused, "ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use", q.name)
		}
	}
	if m.Exclusive && len(q.consumers) > 0 {
		return channelErr(AccessRefused, "ACCESS_REFUSED - queue '%s' in vhost '/' in exclusive use", q.name)
	}
	if err := b.consumerArgsRefusal(q, m.Arguments); err != nil {
		return err
	}
	cs := &consumer{tag: tag, ch: ch, queue: q, noAck: m.NoAck, exclusive: m.Exclusive, prefetch: ch.prefetch}
	if v, ok := m.Arguments["x-priority"]; ok {
		n, ok := intArg(v)
		if !ok {
			return channelErr(PreconditionFailed, `PRECONDITION_FAILED - invalid arg 'x-priority' for queue '%s' in vhost '/': "expected integer, got %s"`, q.name, fieldType(v))
		}
		cs.priority = int(n)
	}
	if q.stream {
		if m.NoAck || ch.prefetch == 0 { // the channel's global prefetch does not count
			if b.atLeast(4, 0) {
				return channelErr(PreconditionFailed, "PRECONDITION_FAILED - consumer prefetch count is not set for stream queue '%s' in vhost '/'", q.name)
			}
			return channelErr(PreconditionFailed, "PRECONDITION_FAILED - consumer prefetch count is not set for 'queue '%s' in vhost '/''", q.name)
		}
		cs.offset = streamOffset(q, m.Arguments["x-stream-offset"])
	}
	ch.consumers[tag] = cs
	q.consumers = append(q.consumers, cs)
	if len(q.consumers) == 1 {
		b.consumed = append(b.consumed, q)
	}
	q.hadConsumer = true
	b.touchLocked(q)
	if !m.NoWait {
		ch.c.sendMethod(ch.id, &basicConsumeOk{ConsumerTag: tag})
	}
	b.dispatchLocked()
	return nil
}

// get takes one message of a queue.
func (ch *channel) get(m *basicGet) error {
	b := ch.c.b
	q, err := b.queueFor(ch.c, m.Queue)
	if err != nil {
		return err
	}
	if q.stream {
		return channelErr(NotImplemented, "NOT_IMPLEMENTED - basic.get not supported by stream queues '%s' in vhost '/'", q.name)
	}
	if q.quorum && q.single {
		return channelErr(ResourceLocked, "RESOURCE_LOCKED - cannot obtain access to locked queue '%s' in vhost '/'. basic.get operations are not supported by quorum queues with single active consumer", q.name)
	}
	b.touchLocked(q)
	defer b.dispatchLocked() // to where the expiries below dead-letter
	b.armExpiryLocked(q)     // a head due before its timer ran expires, not goes out
	if len(q.ready) == 0 {
		ch.c.sendMethod(ch.id, &basicGetEmpty{})
		return nil
	}
	qd := q.take()
	b.armExpiryLocked(q) // the new head may be due: it expires now, and does not count
	tag := ch.track(q, qd, nil, m.NoAck)
	p := deliveredProps(qd)
	if q.quorum && !b.atLeast(4, 0) { // RabbitMQ 3.10 tells the count on every basic.get, 0 too
		p = withHeader(p, "x-delivery-count", int64(qd.deliveries))
	}
	ch.c.sendMethod(ch.id, &basicGetOk{DeliveryTag: tag, Redelivered: qd.redelivered, Exchange: qd.msg.exchange,
		RoutingKey: qd.msg.routingKey, MessageCount: uint32(len(q.ready)), Properties: p, Body: qd.msg.body})
	return nil
}

// track gives a delivery its tag, and keeps it until it is settled unless noAck.
func (ch *channel) track(q *queue, qd *queued, cs *consumer, noAck bool) uint64 {
	ch.lastTag++
	if !noAck {
		if cs != nil {
			cs.unacked++
		}
		ch.unacked[ch.lastTag] = &delivery{q: q, qd: qd, cs: cs}
		ch.tags = append(ch.tags, ch.lastTag)
	}
	return ch.lastTag
}

// settle acks, or nacks (requeued or dropped), one delivery tag or every one up to it.
func (ch *channel) settle(tag uint64, multiple, nack, requeue bool) error {
	var tags []uint64
	switch {
	case multiple && tag == 0:
		tags = slices.Clone(ch.tags)
	case multiple:
		for _, t := range ch.tags {
			if t <= tag {
				tags = append(tags, t)
			}
		}
	default:
		if ch.unacked[tag] == nil {
			return channelErr(PreconditionFailed, "PRECONDITION_FAILED - unknown delivery tag %d", tag)
		}
		tags = []uint64{tag}
	}
	if multiple && len(tags) == 0 && tag != 0 {
		return channelErr(PreconditionFailed, "PRECONDITION_FAILED - unknown delivery tag %d", tag)
	}
	ds := make([]*delivery, len(tags))
	for i, t := range tags {
		ds[i] = ch.unacked[t]
		delete(ch.unacked, t)
	}
	ch.tags = slices.DeleteFunc(ch.tags, func(t uint64) bool { return ch.unacked[t] == nil })
	if ch.tx {
		ch.pending = append(ch.pending, pending{tags: tags, ds: ds, nack: nack, requeue: requeue})
		return nil
	}
	ch.settled(ds, nack, requeue)
	return nil
}

// settled carries out a settlement of deliveries, taken from the channel's unacked ones.
func (ch *channel) settled(back []*delivery, nack, requeue bool) {
	for _, d := range back {
		if d.cs != nil {
			d.cs.unacked--
		}
		kind := "acked"
		if nack && requeue {
			kind = "requeued"
		} else if nack {
			kind = "rejected"
		}
		ch.c.b.recordLocked(kind, d.qd.msg, d.q.name, "")
	}
	if nack && !requeue {
		ch.c.b.rejectLocked(back)
	} else if nack {
		ch.c.b.requeueLocked(back, true)
	}
	ch.c.b.dispatchLocked()
}

// requeueAllLocked returns every unacked delivery of the channel to its queue: requeued by the
// client (basic.recover), or left by the channel's close.
func (ch *channel) requeueAllLocked(requeued bool) {
	back := make([]*delivery, 0, len(ch.tags))
	for _, t := range ch.tags {
		d := ch.unacked[t]
		if d.cs != nil {
			d.cs.unacked--
		}
		back = append(back, d)
	}
	ch.unacked, ch.tags = map[uint64]*delivery{}, nil
	ch.c.b.requeueLocked(back, requeued)
}

// cancelLocked removes a consumer.
func (ch *channel) cancelLocked(cs *consumer) {
	delete(ch.consumers, cs.tag)
	if cs == ch.reply {
		delete(ch.c.b.replies, ch.replyTo)
		ch.reply = nil
		return
	}
	q := cs.queue
	q.consumers = slices.DeleteFunc(q.consumers, func(o *consumer) bool { return o == cs })
	if len(q.consumers) == 0 {
		ch.c.b.unconsumedLocked(q)
	}
	if q.autoDelete && q.hadConsumer && len(q.consumers) == 0 {
		ch.c.b.deleteQueueLocked(q.name)
		return
	}
	ch.c.b.touchLocked(q)
}

// closeLocked ends the channel's consumers and returns its unacked messages.
func (ch *channel) closeLocked() {
	for _, cs := range ch.consumers {
		ch.cancelLocked(cs)
	}
	ch.rollback()
	ch.requeueAllLocked(false)
	ch.c.b.dispatchLocked()
}

// streamOffset is where a consumer of stream q starts reading, as x-stream-offset says:
// "first", "last", "next" (the default), an offset, a timestamp (the first message appended at
// or after it), or an interval back from now ("10m": a number and one of Y, M, D, h, m, s).
func streamOffset(q *queue, arg any) int {
	at := func(t time.Time) int {
		i, _ := slices.BinarySearchFunc(q.logAt, t, func(a, t time.Time) int { return a.Compare(t) })
		return i
	}
	switch v := arg.(type) {
	case string:
		switch v {
		case "first":
			return 0
		case "last":
			return max(len(q.log)-1, 0)
		}
		if d, ok := interval(v); ok {
			return at(time.Now().Add(-d))
		}
	case time.Time:
		return at(v)
	default:
		if n, ok := intArg(v); ok {
			return min(max(int(n), 0), len(q.log))
		}
	}
	return len(q.log)
}

// interval reads a stream's interval, as x-max-age and x-stream-offset write it: a number
// and a unit, Y (365 days), M (30 days), D, h, m or s.
func interval(s string) (time.Duration, bool) {
	unit := map[byte]time.Duration{'Y': 365 * 24 * time.Hour, 'M': 30 * 24 * time.Hour, 'D': 24 * time.Hour,
		'h': time.Hour, 'm': time.Minute, 's': time.Second}
	if len(s) < 2 || unit[s[len(s)-1]] == 0 {
		return 0, false
	}
	n, err := strconv.Atoi(s[:len(s)-1])
	if err != nil || n < 0 {
		return 0, false
	}
	return time.Duration(n) * unit[s[len(s)-1]], true
}

// directReplyTo is the pseudo-queue of direct reply-to: a channel consuming it (no-ack) gets
// the messages published to its reply address, which its publishes' reply_to becomes.
const directReplyTo = "amq.rabbitmq.reply-to"

// consumeReplies makes ch the consumer of its direct reply-to address.
func (ch *channel) consumeReplies(m *basicConsume) error {
	b := ch.c.b
	if !m.NoAck {
		return channelErr(PreconditionFailed, "PRECONDITION_FAILED - reply consumer cannot acknowledge")
	}
	if ch.reply != nil {
		return channelErr(PreconditionFailed, "PRECONDITION_FAILED - reply consumer already set")
	}
	tag := m.ConsumerTag
	if tag == "" {
		b.seq++
		tag = fmt.Sprintf("amq.ctag-%d", b.seq)
	}
	b.seq++
	ch.reply = &consumer{tag: tag, ch: ch, noAck: true}
	ch.replyTo = fmt.Sprintf("%s.g%d", directReplyTo, b.seq)
	ch.consumers[tag] = ch.reply
	b.replies[ch.replyTo] = ch
	if !m.NoWait {
		ch.c.sendMethod(ch.id, &basicConsumeOk{ConsumerTag: tag})
	}
	return nil
}
