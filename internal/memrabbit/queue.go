package memrabbit

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"strconv"
	"time"
)

// stored is a message in the broker.
type stored struct {
	exchange   string
	routingKey string
	props      properties
	body       []byte
}

// queued is a message waiting in a queue: redelivered once it was delivered and came back.
type queued struct {
	msg         *stored
	redelivered bool
	expires     time.Time // zero: never
	deliveries  int       // returns to a quorum queue (x-delivery-count)
	seq         uint64    // its place in the order its queue took messages in
}

// queue holds messages for its consumers.
type queue struct {
	name        string
	durable     bool
	exclusive   *conn // the connection that declared it exclusive
	autoDelete  bool
	args        Table
	ready       []*queued
	seq         uint64 // the last queued.seq given
	returned    int    // a quorum queue's returns: the first of ready, given out first
	consumers   []*consumer
	next        int  // the consumer the next delivery tries first
	hadConsumer bool // an auto-delete queue goes with its last consumer

	// A stream keeps every message in log; each of its consumers reads from an offset of its
	// own (consumer.offset), and an ack is credit only.
	stream bool
	log    []*stored
	logAt  []time.Time // when each of log was appended

	// From the arguments.
	quorum        bool
	ttl           time.Duration // x-message-ttl; negative: none
	dlx           *string       // x-dead-letter-exchange
	dlrk          *string       // x-dead-letter-routing-key
	maxLength     int           // x-max-length; negative: none
	maxBytes      int           // x-max-length-bytes, of the ready messages' bodies; negative: none
	overflow      string        // x-overflow: drop-head, reject-publish, reject-publish-dlx
	deliveryLimit int           // x-delivery-limit (quorum): a message returned more often is dead-lettered; math.MaxInt: none
	single        bool          // x-single-active-consumer
	expires       time.Duration // x-expires; zero: never
	maxPriority   int           // x-max-priority (classic); zero: none
	quorum4       bool          // a quorum queue of RabbitMQ 4.0 or later (see nextIndex, nextConsumer)
	high          int           // of its ready messages after the returns, how many have the high one
	dequeues      int           // its count of what it gave out, 0 to 2 (rabbit_fifo_q's dequeue_counter)

	armed  time.Time   // when its head expires; zero: never
	armSeq uint64      // when armed was set, among the broker's queues
	heapAt int         // its index in the broker's expiring; -1: not there
	unused *time.Timer // for x-expires
}

// kind is q's type: classic, quorum or stream.
func (q *queue) kind() string {
	switch {
	case q.quorum:
		return "quorum"
	case q.stream:
		return "stream"
	}
	return "classic"
}

// touchLocked restarts q's x-expires countdown: a queue expires after that long without a
// consumer, a basic.get or a redeclaration.
func (b *Broker) touchLocked(q *queue) {
	if q.expires <= 0 {
		return
	}
	if q.unused != nil {
		q.unused.Stop()
		q.unused = nil
	}
	if len(q.consumers) > 0 {
		return
	}
	q.unused = time.AfterFunc(q.expires, func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.queues[q.name] == q && len(q.consumers) == 0 {
			b.deleteQueueLocked(q.name)
		}
	})
}

// newQueue returns a queue declared with args.
func (b *Broker) newQueue(name string, durable, autoDelete bool, args Table) *queue {
	q := &queue{name: name, durable: durable, autoDelete: autoDelete, args: args,
		ttl: -1, maxLength: -1, maxBytes: -1, overflow: "drop-head", deliveryLimit: math.MaxInt, heapAt: -1}
	q.quorum = args["x-queue-type"] == "quorum"
	q.stream = args["x-queue-type"] == "stream"
	if ms, ok := intArg(args["x-message-ttl"]); ok {
		q.ttl = time.Duration(ms) * time.Millisecond
	}
	if x, ok := args["x-dead-letter-exchange"].(string); ok {
		q.dlx = &x
	}
	if k, ok := args["x-dead-letter-routing-key"].(string); ok {
		q.dlrk = &k
	}
	if n, ok := intArg(args["x-max-length"]); ok {
		q.maxLength = int(n)
	}
	if n, ok := intArg(args["x-max-length-bytes"]); ok {
		q.maxBytes = int(n)
	}
	if o, ok := args["x-overflow"].(string); ok {
		q.overflow = o
	}
	if n, ok := intArg(args["x-delivery-limit"]); ok && q.quorum {
		q.deliveryLimit = int(n) // a negative one: the first return is over it on 3.10 (measured on 3.10.8)
		if n < 0 && b.atLeast(4, 0) {
			q.deliveryLimit = math.MaxInt // none on 4.0
		}
	} else if q.quorum && b.atLeast(4, 0) {
		q.deliveryLimit = 20 // RabbitMQ 4.0's default
	}
	q.quorum4 = q.quorum && b.atLeast(4, 0)
	q.single, _ = args["x-single-active-consumer"].(bool)
	if n, ok := intArg(args["x-max-priority"]); ok && !q.quorum && !q.stream {
		q.maxPriority = int(n)
	}
	if ms, ok := intArg(args["x-expires"]); ok {
		q.expires = time.Duration(ms) * time.Millisecond
	}
	return q
}

// intArg returns an integer argument of any width.
func intArg(v any) (int64, bool) {
	switch n := v.(type) {
	case int8:
		return int64(n), true
	case int16:
		return int64(n), true
	case int32:
		return int64(n), true
	case int64:
		return n, true
	case int:
		return int64(n), true
	case uint8:
		return int64(n), true
	case uint16:
		return int64(n), true
	case uint32:
		return int64(n), true
	}
	return 0, false
}

// enqueueLocked puts msg at the tail of q, and reports false when q refuses it (x-overflow
// reject-publish): the publish is then nacked.
func (b *Broker) enqueueLocked(q *queue, msg *stored) bool {
	b.enqueued++
	if q.stream {
		q.log, q.logAt = append(q.log, msg), append(q.logAt, time.Now())
		return true
	}
	if q.full(msg) {
		switch q.overflow {
		case "reject-publish":
			return false
		case "reject-publish-dlx":
			b.deadLetterLocked(q, &queued{msg: msg}, "maxlen")
			return false
		}
	}
	qd := &queued{msg: msg}
	now := time.Now()
	if exp := expiryOf(q, msg, now); !exp.IsZero() {
		qd.expires = exp
	}
	q.put(qd)
	if !qd.expires.IsZero() && !qd.expires.After(now) && len(q.ready) == 1 {
		// Due already (a TTL of 0): delivered if a consumer can take it now, else it expires.
		if cs := q.nextConsumer(); cs != nil {
			b.deliverLocked(q, cs, q.take())
		}
	}
	for q.overflow == "drop-head" && q.over() {
		b.deadLetterLocked(q, q.take(), "maxlen")
	}
	b.armExpiryLocked(q)
	return true
}

// full reports whether q refuses msg: a classic queue that msg would take over its limits, a
// quorum queue already over them (measured on 3.10.8 and 4.0.5: a quorum queue of x-max-length
// 1 takes two, one of x-max-length-bytes 10 takes bodies of 4, 4 and 5 bytes).
func (q *queue) full(msg *stored) bool {
	if q.quorum {
		return q.over()
	}
	return q.maxLength >= 0 && len(q.ready) >= q.maxLength || q.maxBytes >= 0 && q.bytes()+len(msg.body) > q.maxBytes
}

// over reports whether q holds more than its limits.
func (q *queue) over() bool {
	return q.maxLength >= 0 && len(q.ready) > q.maxLength || q.maxBytes >= 0 && q.bytes() > q.maxBytes
}

// bytes is the size of q's ready messages, as x-max-length-bytes counts it: their bodies.
func (q *queue) bytes() int {
	n := 0
	for _, qd := range q.ready {
		n += len(qd.msg.body)
	}
	return n
}

// expiryOf is when msg, enqueued at now, expires in q: the queue's TTL or the message's
// expiration, whichever is sooner; zero: never.
func expiryOf(q *queue, msg *stored, now time.Time) time.Time {
	ttl := q.ttl
	if msg.props.Expiration != "" {
		if ms, err := strconv.ParseInt(msg.props.Expiration, 10, 64); err == nil && ms >= 0 {
			if d := time.Duration(ms) * time.Millisecond; ttl < 0 || d < ttl {
				ttl = d
			}
		}
	}
	if ttl < 0 {
		return time.Time{}
	}
	return now.Add(ttl)
}

// armExpiryLocked has the message q gives out next (its head, see nextIndex) expire when it
// is due (see expire), expiring at once those that are due. Only that one expires, as on
// RabbitMQ: a message behind a later one waits for it.
func (b *Broker) armExpiryLocked(q *queue) {
	now := time.Now()
	b.expireLocked(q, now)
	var at time.Time
	if len(q.ready) > 0 {
		at = q.ready[q.nextIndex()].expires
	}
	b.setExpiryLocked(q, at)
}

// returnLocked puts a message delivered from q back, marked redelivered; a quorum queue counts
// the return, and dead-letters a message returned more often than its delivery limit. Where
// it goes (measured on 3.10.8 and 4.0.5):
//   - a classic queue puts each where it was, by the order the queue took them in;
//   - a quorum queue gives its returns out first, in the order they came back; but on RabbitMQ
//     3.10 what its client requeued (a nack or reject with requeue, a recover) goes to its
//     tail, and only what a closed channel held is a return.
func (b *Broker) returnLocked(q *queue, qd *queued, requeued bool) {
	if b.queues[q.name] != q || q.stream {
		return // deleted; or a stream, which keeps them all
	}
	qd.redelivered = true
	if q.quorum {
		qd.deliveries++
		if qd.deliveries > q.deliveryLimit {
			b.deadLetterLocked(q, qd, "delivery_limit")
			return
		}
	}
	switch {
	case !q.quorum:
		q.insert(qd)
	case requeued && !b.atLeast(4, 0):
		q.ready = append(q.ready, qd)
	default:
		q.ready = slices.Insert(q.ready, q.returned, qd)
		q.returned++
	}
	b.armExpiryLocked(q)
}

// high reports whether qd has the high priority of a quorum queue of RabbitMQ 4.0: above 4.
func high(qd *queued) bool {
	return qd.msg.props.Priority > 4
}

// priority is qd's priority in a classic queue q: its message's, at most q's maximum (no
// priority: 0).
func (q *queue) priority(qd *queued) int {
	return min(int(qd.msg.props.Priority), q.maxPriority)
}

// put adds a message q takes to its ready messages: at the tail; in a priority queue, after
// every message of its priority or higher.
func (q *queue) put(qd *queued) {
	q.seq++
	qd.seq = q.seq
	if q.quorum4 && high(qd) {
		q.high++
	}
	if q.maxPriority > 0 {
		q.insert(qd)
	} else {
		q.ready = append(q.ready, qd)
	}
}

// insert puts qd among a classic queue's ready messages, which are in the order the queue
// gives them out: the highest priority first, each priority in the order the queue took them.
func (q *queue) insert(qd *queued) {
	p := q.priority(qd)
	i, _ := slices.BinarySearchFunc(q.ready, qd, func(o, _ *queued) int {
		if op := q.priority(o); op != p {
			return p - op
		}
		return cmp.Compare(o.seq, qd.seq)
	})
	q.ready = slices.Insert(q.ready, i, qd)
}

// nextIndex is the index in q.ready of the message q gives out next: its head, but a quorum queue of
// RabbitMQ 4.0 keeps two priorities after its returns and gives out two of the high one, then
// whichever of the two came first (rabbit_fifo_q; measured on 4.0.5).
func (q *queue) nextIndex() int {
	if q.returned > 0 || q.high == 0 {
		return 0
	}
	h := slices.IndexFunc(q.ready, high)
	n := slices.IndexFunc(q.ready, func(qd *queued) bool { return !high(qd) })
	if n >= 0 && q.dequeues == 2 {
		return min(h, n)
	}
	return h
}

// take removes the message q gives out next from its ready messages, and returns it.
func (q *queue) take() *queued {
	i := q.nextIndex()
	qd := q.ready[i]
	switch {
	case i < q.returned:
		q.returned--
	case q.quorum4:
		q.dequeues = (q.dequeues + 1) % 3
		if high(qd) {
			q.high--
		}
	}
	if i == 0 {
		q.ready = q.ready[1:]
	} else {
		q.ready = slices.Delete(q.ready, i, i+1)
	}
	return qd
}

// clear empties q's ready messages.
func (q *queue) clear() {
	q.ready, q.returned, q.high = nil, 0, 0
}

// expireLocked dead-letters the messages q gives out next while they are due by now.
func (b *Broker) expireLocked(q *queue, now time.Time) {
	for len(q.ready) > 0 {
		if exp := q.ready[q.nextIndex()].expires; exp.IsZero() || exp.After(now) {
			return
		}
		b.deadLetterLocked(q, q.take(), "expired")
	}
}

// deadLetterLocked sends qd, which leaves q for reason, to q's dead-letter exchange, with
// its x-death header updated; without one (or when it does not exist) the message is
// dropped.
func (b *Broker) deadLetterLocked(q *queue, qd *queued, reason string) {
	x, ok := (*exchange)(nil), false
	if q.dlx != nil {
		x, ok = b.exchanges[*q.dlx]
	}
	if !ok {
		b.recordLocked("dropped", qd.msg, q.name, reason)
		return
	}
	b.recordLocked("dead-lettered", qd.msg, q.name, reason)
	msg := *qd.msg
	msg.props.deaths = deathHeaders(b.atLeast(3, 13), qd.msg, q.name, reason, time.Now())
	msg.props.Expiration = ""
	more := ccKeys(msg.props.Headers)
	if q.dlrk != nil {
		// Its keys are replaced; RabbitMQ 3.10 also drops the CC header (4.0.5 keeps it).
		msg.routingKey, more = *q.dlrk, nil
		if _, ok := msg.props.Headers["CC"]; ok && !b.atLeast(4, 0) {
			msg.props.Headers = maps.Clone(msg.props.Headers)
			delete(msg.props.Headers, "CC")
		}
	}
	msg.exchange = *q.dlx
	for _, to := range b.routeLocked(x, msg.routingKey, more, &msg.props) {
		if reason != "rejected" && isCycle(to.name, msg.props.header("x-death")) {
			continue // dropped, as RabbitMQ drops a fully automatic dead-letter cycle
		}
		b.enqueueLocked(to, &msg)
	}
}

// deathHeaders returns the headers the broker sets on msg's dead-lettering (properties.deaths):
// the x-death entry of the queue and reason counted and moved to the front (a new one
// otherwise), and the x-first-death-* headers set once (x-last-death-* too, from RabbitMQ
// 3.13).
func deathHeaders(lastDeath bool, msg *stored, queueName, reason string, now time.Time) Table {
	h := make(Table, 7)
	maps.Copy(h, msg.props.deaths)
	deaths, _ := msg.props.header("x-death").([]any)
	var entry Table
	var rest []any
	for _, d := range deaths {
		t, ok := d.(Table)
		if ok && entry == nil && t["queue"] == queueName && t["reason"] == reason {
			entry = maps.Clone(t)
			n, _ := intArg(t["count"])
			entry["count"] = n + 1
			entry["time"] = now.Truncate(time.Second)
			continue
		}
		rest = append(rest, d)
	}
	if entry == nil {
		entry = Table{"count": int64(1), "reason": reason, "queue": queueName, "time": now.Truncate(time.Second),
			"exchange": msg.exchange, "routing-keys": routingKeys(msg)}
		if msg.props.Expiration != "" {
			entry["original-expiration"] = msg.props.Expiration
		}
	}
	if !lastDeath && len(deaths) >= 2 {
		// RabbitMQ 3.10 regroups the other entries by queue and reason with a fold that
		// reverses them (rabbit_dead_letter:group_by_queue_and_reason): after three hops
		// through p2, p1 and p0, x-death reads p0, p2, p1.
		slices.Reverse(rest)
	}
	h["x-death"] = append(append(make([]any, 0, 1+len(rest)), entry), rest...)
	if !msg.props.hasHeader("x-first-death-reason") {
		h["x-first-death-reason"], h["x-first-death-queue"], h["x-first-death-exchange"] = reason, queueName, msg.exchange
	}
	if lastDeath {
		h["x-last-death-reason"], h["x-last-death-queue"], h["x-last-death-exchange"] = reason, queueName, msg.exchange
	}
	return h
}

// routingKeys are the keys msg was routed with, as x-death tells them: its routing key and
// its CC header's.
func routingKeys(msg *stored) []any {
	keys := []any{msg.routingKey}
	for _, k := range ccKeys(msg.props.Headers) {
		keys = append(keys, k)
	}
	return keys
}

// ccKeys returns the routing keys in the CC header of a message with headers h.
func ccKeys(h Table) []string {
	cc, _ := h["CC"].([]any)
	return stringsIn(cc)
}

// stringsIn returns the strings of an array header: RabbitMQ skips the rest.
func stringsIn(arr []any) []string {
	var out []string
	for _, v := range arr {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

// isCycle reports whether dead-lettering into queue closes a cycle with no rejection in it:
// queue is among the deaths (newest first), and neither it nor any death before it was a
// rejection. Anything in x-death that is not a table means a client wrote it: no cycle.
func isCycle(queueName string, xdeath any) bool {
	deaths, _ := xdeath.([]any)
	i := slices.IndexFunc(deaths, func(d any) bool {
		t, ok := d.(Table)
		return ok && t["queue"] == queueName
	})
	if i < 0 {
		return false
	}
	for _, d := range deaths[:i+1] {
		t, ok := d.(Table)
		if !ok || t["reason"] == "rejected" {
			return false
		}
	}
	return true
}

// withHeader returns p with header key set to v, on a copy of its headers: a stored message,
// and its headers, are shared by every queue it was routed to.
func withHeader(p properties, key string, v any) properties {
	h := p.headers()
	if p.deaths == nil {
		h = maps.Clone(h)
	}
	if h == nil {
		h = Table{}
	}
	h[key] = v
	p.Headers, p.deaths = h, nil
	return p
}

// header returns the value of header key of a message with properties p (nil: none).
func (p *properties) header(key string) any {
	v, _ := p.lookup(key)
	return v
}

// lookup returns the value of header key of a message with properties p, and whether it has
// it.
func (p *properties) lookup(key string) (any, bool) {
	if v, ok := p.deaths[key]; ok {
		return v, true
	}
	v, ok := p.Headers[key]
	return v, ok
}

// hasHeader reports whether a message with properties p has header key.
func (p *properties) hasHeader(key string) bool {
	_, ok := p.lookup(key)
	return ok
}

// headers returns the headers of a message with properties p: its own, with those of its
// dead-letterings over them, in a new Table when there were dead-letterings.
func (p *properties) headers() Table {
	if p.deaths == nil {
		return p.Headers
	}
	h := make(Table, len(p.Headers)+len(p.deaths))
	maps.Copy(h, p.Headers)
	maps.Copy(h, p.deaths)
	return h
}
