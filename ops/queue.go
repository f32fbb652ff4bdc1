package ops

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/telemetry"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/topology"
)

// ErrNoQueue is wrapped by the errors about a queue that does not exist. It is
// kill.ErrNoQueue.
var ErrNoQueue = kill.ErrNoQueue

// source is a queue that is browsed and replayed: a poison queue (work is its work queue) or
// the parking queue (work is "").
type source struct{ queue, work string }

func (o *Ops) poison(queue string) source { return source{topology.PoisonQueue(queue), queue} }
func (o *Ops) parking() source            { return source{o.cfg.Delay.ParkingQueue(), ""} }

// Browse says which messages Poisoned and Parked return.
type Browse struct {
	// Filter selects the messages.
	Filter Filter
	// Limit is the most messages returned (0: all that match).
	Limit int
	// Bodies: return the bodies too.
	Bodies bool
	// Scan is the most messages read, from the head of the queue (0: all). Reading fewer
	// than all is faster on a long queue, but a quorum queue on RabbitMQ 3.x puts the
	// messages read back at its tail (measured on 3.10.8; 4.0 puts them back where they
	// were, as a classic queue does): each such browse moves them behind the others.
	Scan int
}

// Poisoned returns the messages of the poison queue of queue that b selects, in queue order,
// and leaves the queue as it was (see the package doc).
func (o *Ops) Poisoned(ctx context.Context, queue string, b Browse) ([]Message, error) {
	return o.browse(ctx, o.poison(queue), b)
}

// Parked returns the messages of the parking queue of the delay levels that b selects, in
// queue order, and leaves the queue as it was (see the package doc).
func (o *Ops) Parked(ctx context.Context, b Browse) ([]Message, error) {
	return o.browse(ctx, o.parking(), b)
}

func (o *Ops) browse(ctx context.Context, src source, b Browse) ([]Message, error) {
	var out []Message
	err := o.scan(ctx, "ops: browse "+src.queue, src, b.Scan, func(ch *amqp.Channel, pos int, d amqp.Delivery) (bool, error) {
		if pos == 1 {
			out = out[:0] // a retried scan starts again
		}
		if m := fromDelivery(pos, d, src.work, b.Bodies); b.Filter.Match(m) && (b.Limit == 0 || len(out) < b.Limit) {
			out = append(out, m)
		}
		return false, nil
	})
	return out, err
}

// DeletePoisoned deletes the messages of the poison queue of queue that b selects (b.Bodies
// aside), and returns how many; the others stay, in their order. A lost connection is
// retried, and then the count may hold a message twice: the broker does not confirm an ack,
// so one it had not applied is deleted, and counted, again.
func (o *Ops) DeletePoisoned(ctx context.Context, queue string, b Browse) (int, error) {
	src := o.poison(queue)
	var n int
	err := o.scan(ctx, "ops: delete from "+src.queue, src, 0, func(ch *amqp.Channel, pos int, d amqp.Delivery) (bool, error) {
		if m := fromDelivery(pos, d, src.work, false); !b.Filter.Match(m) || b.Limit > 0 && n >= b.Limit {
			return false, nil
		}
		if err := ch.Ack(d.DeliveryTag, false); err != nil {
			return false, err
		}
		n++
		return true, nil
	})
	return n, err
}

// scan takes every message of src's queue (the first limit, if limit > 0), unacknowledged,
// and passes each to each in queue order (pos 1 first), which may acknowledge it (and then
// says so). At the end it hands back all the others at once. Past what the caller needs, the
// rest is taken all the same: a quorum queue on RabbitMQ 3.x puts a message it gets back at
// its tail (on 4.0 where it was), so only handing back all of them at once keeps the order.
func (o *Ops) scan(ctx context.Context, what string, src source, limit int, each func(ch *amqp.Channel, pos int, d amqp.Delivery) (acked bool, err error)) error {
	return o.call(ctx, what, func(ctx context.Context, ch *amqp.Channel) error {
		q, err := passive(ctx, ch, src.queue)
		if err != nil || q.Messages == 0 {
			return err
		}
		n := q.Messages
		if limit > 0 {
			n = min(n, limit)
		}
		tk, err := take(ctx, ch, src.queue, n)
		if err != nil {
			return err
		}
		defer tk.close()
		var last uint64 // the last message held
		acked := 0
		defer func() {
			for _, d := range tk.stop(ctx) { // delivered meanwhile: held too
				last = d.DeliveryTag
			}
			if last > 0 && ch.Nack(last, true, true) == nil {
				settle(ctx, ch, src.queue, q.Messages-acked, o.cfg.Timeout)
			}
		}()
		for pos := 1; pos <= n; pos++ {
			d, ok, err := tk.next(ctx)
			if err != nil || !ok {
				return err
			}
			if ok, err = each(ch, pos, d); err != nil {
				return err
			}
			if ok {
				acked++
			} else {
				last = d.DeliveryTag
			}
		}
		return nil
	})
}

// taker takes the messages of a queue through consumers on one channel, in queue order.
//
// The broker streams the messages to consumers rather than giving them one basic.get (a
// round trip) at a time: measured on RabbitMQ 3.10.8, basic.get did not take the 100,000
// poison messages of a quorum queue within a minute; consumers took them in 2.9s, and in
// about 7s once they had been handed back before (5.6–6.3s on 4.0.5). A consumer holds at
// most 65,535 unacknowledged messages (its prefetch count, 16 bits; a quorum queue gives one
// without a limit 2,000), so there is one per 65,535 messages. They share the channel, whose
// delivery tags number the messages in the order the queue gave them.
type taker struct {
	ch      *amqp.Channel
	queue   string
	merged  chan amqp.Delivery // from every consumer; closed once all have ended
	quit    chan struct{}      // closed by close: the consumers' forwarders stop
	tags    []string
	pending map[uint64]amqp.Delivery // delivered, not yet returned by next
	next1   uint64                   // the tag next returns
	tick    *time.Ticker
	last    time.Time // when the last message came; zero before the first
	closed  bool
}

// take starts taking n messages of queue on ch, a channel that has taken none before (its
// first delivery tag is 1). Close the taker when done.
func take(ctx context.Context, ch *amqp.Channel, queue string, n int) (*taker, error) {
	t := &taker{ch: ch, queue: queue, merged: make(chan amqp.Delivery, 256), quit: make(chan struct{}),
		pending: map[uint64]amqp.Delivery{}, next1: 1, tick: time.NewTicker(250 * time.Millisecond)}
	var wg sync.WaitGroup
	err := amqpx.Do(ctx, ch, func() error {
		for i := range (n + maxPrefetch - 1) / maxPrefetch {
			if err := ch.Qos(min(n, maxPrefetch), 0, false); err != nil {
				return err
			}
			tag := "warren-ops-take-" + strconv.Itoa(i)
			ds, err := ch.Consume(queue, tag, false, false, false, false, nil)
			if err != nil {
				return err
			}
			t.tags = append(t.tags, tag)
			wg.Go(func() {
				for d := range ds {
					select {
					case t.merged <- d:
					case <-t.quit:
						return
					}
				}
			})
		}
		return nil
	})
	go func() {
		wg.Wait()
		close(t.merged)
	}()
	if err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

// next returns the next message of the queue; ok is false when the queue has none left to
// give: once messages have come, none came for takeQuiet while next waited and the queue
// counts none ready (another reader took them). The broker counts the messages it is sending
// as not ready, so a shorter pause can end a take early on a busy machine (1s did, in the
// tests run 8 at once with the race detector); the time the caller spent between calls does
// not count (a replay's commit can take longer than takeQuiet there, while the messages wait
// in the channel); before the first one comes, the broker may be slow to start, and next
// waits for as long as ctx lets it.
func (t *taker) next(ctx context.Context) (d amqp.Delivery, ok bool, err error) {
	called := time.Now()
	for {
		if d, ok := t.pending[t.next1]; ok {
			delete(t.pending, t.next1)
			t.next1++
			return d, true, nil
		}
		select {
		case d, open := <-t.merged:
			if !open {
				return d, false, fmt.Errorf("the broker cancelled the consumers of %s (deleted?)", t.queue)
			}
			t.pending[d.DeliveryTag], t.last = d, time.Now()
		case <-t.tick.C:
			if t.last.IsZero() || time.Since(t.last) < takeQuiet || time.Since(called) < takeQuiet {
				continue
			}
			if q, err := passive(ctx, t.ch, t.queue); err != nil || q.Messages == 0 {
				return d, false, err
			}
		case <-ctx.Done():
			return d, false, context.Cause(ctx)
		}
	}
}

// takeQuiet is how long a take waits for the next message before it asks whether any is
// left (a variable for a test to shorten).
var takeQuiet = 5 * time.Second

// stop cancels the consumers and returns, in order, the messages they were given that next
// has not returned: they are held like the others, for one nack to hand everything back in
// order. If a cancel fails (ctx is done, the channel is closed), it returns those it has.
func (t *taker) stop(ctx context.Context) []amqp.Delivery {
	cancelled := true
	for _, tag := range t.tags {
		if amqpx.Do(ctx, t.ch, func() error { return t.ch.Cancel(tag, false) }) != nil {
			cancelled = false
			break
		}
	}
	if cancelled {
		for d := range t.merged { // closed once every consumer is cancelled
			t.pending[d.DeliveryTag] = d
		}
	}
	t.close()
	left := slices.Collect(maps.Values(t.pending))
	slices.SortFunc(left, func(a, b amqp.Delivery) int { return cmp.Compare(a.DeliveryTag, b.DeliveryTag) })
	t.pending = map[uint64]amqp.Delivery{}
	return left
}

// close stops the forwarders (the channel's closing ends the consumers); it may be called
// more than once.
func (t *taker) close() {
	if !t.closed {
		t.closed = true
		close(t.quit)
		t.tick.Stop()
	}
}

// maxPrefetch is the largest prefetch count AMQP 0-9-1 can give a consumer.
const maxPrefetch = 65535

// Depth returns the number of messages ready in the poison queue of queue, or in the parking
// queue of the delay levels when queue is "".
func (o *Ops) Depth(ctx context.Context, queue string) (int, error) {
	src := o.parking()
	if queue != "" {
		src = o.poison(queue)
	}
	var n int
	err := o.call(ctx, "ops: depth of "+src.queue, func(ctx context.Context, ch *amqp.Channel) error {
		q, err := passive(ctx, ch, src.queue)
		n = q.Messages
		return err
	})
	return n, err
}

// PurgePoisoned deletes every message of the poison queue of queue, and returns how many.
func (o *Ops) PurgePoisoned(ctx context.Context, queue string) (int, error) {
	var n int
	src := o.poison(queue)
	err := o.call(ctx, "ops: purge "+src.queue, func(ctx context.Context, ch *amqp.Channel) error {
		if _, err := passive(ctx, ch, src.queue); err != nil {
			return err
		}
		return amqpx.Do(ctx, ch, func() (err error) {
			n, err = ch.QueuePurge(src.queue, false)
			return err
		})
	})
	return n, err
}

// passive returns queue as the broker has it, or an error wrapping ErrNoQueue (which closes
// ch).
func passive(ctx context.Context, ch *amqp.Channel, queue string) (amqp.Queue, error) {
	var q amqp.Queue
	err := amqpx.Do(ctx, ch, func() (err error) {
		q, err = ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		return err
	})
	if amqpx.IsNotFound(err) {
		return q, amqpx.GiveUp(fmt.Errorf("%w: %s", ErrNoQueue, queue))
	}
	return q, err
}

// settleMax bounds the wait of cameBack, which expects no message back unless a lost
// connection's come back.
const settleMax = 2 * time.Second

// settle waits until queue counts at least n messages again, for up to limit: the broker
// applies a hand-back asynchronously, and until it has, a quorum queue counts fewer messages
// (measured on RabbitMQ 3.10.8: 0 of 30 for a few milliseconds idle), so that a browse or
// replay that followed at once would see fewer messages than there are. Its consumer count
// cannot tell whether another consumer took some meanwhile (a cancelled consumer is counted
// out a moment later): then it waits for all of limit, and gives up silently.
func settle(ctx context.Context, ch *amqp.Channel, queue string, n int, limit time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	b := backoff.WithContext(&backoff.ExponentialBackOff{InitialInterval: time.Millisecond, RandomizationFactor: 0.5,
		Multiplier: 2, MaxInterval: 100 * time.Millisecond, Stop: backoff.Stop, Clock: backoff.SystemClock}, ctx)
	_ = backoff.Retry(func() error {
		q, err := passive(ctx, ch, queue)
		if err != nil {
			return backoff.Permanent(err)
		}
		if q.Messages < n {
			return errors.New("not yet")
		}
		return nil
	}, b)
}

// ReplayOptions say which messages a replay sends, where and how fast.
type ReplayOptions struct {
	// Filter selects the messages.
	Filter Filter
	// To is the queue they are sent to, instead of each one's Destination. A poison queue or
	// the parking queue of delay levels is refused: the replay fails before it moves anything.
	To string
	// Limit is the most messages replayed (0: all that match).
	Limit int
	// Rate is the most messages replayed per second (0: as fast as the broker takes them).
	Rate float64
	// Batch is the number of messages per transaction. Default 100.
	Batch int
	// Progress, if set, is told the result so far after each transaction.
	Progress func(ReplayResult)
}

// ReplayResult is what a replay did.
type ReplayResult struct {
	// Total is the number of messages the replay had to look at: those replayed before its
	// last pass plus the queue's depth when that pass started.
	Total int `json:"total"`
	// Scanned is the number of messages looked at.
	Scanned int `json:"scanned"`
	// Replayed is the number of messages sent and removed from the queue.
	Replayed int `json:"replayed"`
	// Failed counts, by reason, the selected messages that were left in the queue.
	Failed map[string]int `json:"failed,omitempty"`
	// Missing is how many of those were left because their destination does not exist.
	Missing int `json:"missing,omitempty"`
	// Reconnects is the number of times the replay lost its connection and went on.
	Reconnects int `json:"reconnects,omitempty"`
}

// ReplayPoisoned sends the messages of the poison queue of queue that opt selects back to
// the queue they failed in (or to opt.To), removing them from the poison queue; see the
// package doc for how nothing is lost or sent twice. Their attempt counter starts again.
func (o *Ops) ReplayPoisoned(ctx context.Context, queue string, opt ReplayOptions) (ReplayResult, error) {
	return o.replay(ctx, o.poison(queue), opt)
}

// ReplayParked sends the messages of the parking queue that opt selects to their
// destination (or to opt.To), removing them from the parking queue.
func (o *Ops) ReplayParked(ctx context.Context, opt ReplayOptions) (ReplayResult, error) {
	return o.replay(ctx, o.parking(), opt)
}

func (o *Ops) replay(ctx context.Context, src source, opt ReplayOptions) (ReplayResult, error) {
	var res ReplayResult
	if why := notDestination(opt.To); opt.To != "" && why != "" {
		return res, fmt.Errorf("ops: replay %s to %s: %s: name a work queue", src.queue, opt.To, why)
	}
	if opt.Batch <= 0 {
		opt.Batch = 100
	}
	done := map[string]bool{}
	progressAt := time.Now()
	for {
		conn, err := o.connection(ctx)
		if err != nil {
			return res, err
		}
		before := res.Replayed
		held, err := o.replayPass(ctx, conn, src, opt, &res, done)
		var perm *backoff.PermanentError
		switch {
		case err == nil && res.Reconnects > 0 && o.cameBack(ctx, conn, src.queue, held):
			continue // what the lost connection held came back after this pass began
		case err == nil:
			return res, nil
		case errors.As(err, &perm):
			return res, fmt.Errorf("ops: replay %s: %w", src.queue, perm.Err)
		case ctx.Err() != nil:
			return res, fmt.Errorf("ops: replay %s: %w", src.queue, err)
		}
		if res.Replayed > before {
			progressAt = time.Now()
		} else if time.Since(progressAt) > o.cfg.Timeout {
			return res, fmt.Errorf("ops: replay %s: no progress for %s: %w", src.queue, o.cfg.Timeout, err)
		}
		res.Reconnects++
		o.logger.Info("Replay interrupted, going on", watermill.LogFields{"err": err.Error(), "queue": src.queue, "replayed": res.Replayed})
		_ = amqpx.Close(conn)
	}
}

// cameBack reports whether queue counts more than the held messages a pass handed back,
// waiting for up to settleMax. After a lost connection the broker returns the messages that
// connection had taken (and not replayed for good) when it notices the loss, which may be
// after the next pass counted the queue (docs/decisions.md: a replay through a dropped
// connection).
func (o *Ops) cameBack(ctx context.Context, conn *amqp.Connection, queue string, held int) bool {
	ch, err := conn.Channel()
	if err != nil {
		return false // the next replay finds them
	}
	defer func() { _ = ch.Close() }()
	settle(ctx, ch, queue, held+1, settleMax)
	q, err := passive(ctx, ch, queue)
	return err == nil && q.Messages > held
}

// replayPass replays on one connection, until the queue is scanned or something fails, and
// returns how many messages it handed back (taken and not replayed).
func (o *Ops) replayPass(ctx context.Context, conn *amqp.Connection, src source, opt ReplayOptions, res *ReplayResult, done map[string]bool) (int, error) {
	stop := amqpx.Watch(ctx, conn)
	defer stop()
	ch, err := conn.Channel()
	if err != nil {
		return 0, err
	}
	defer func() { _ = ch.Close() }() // hands back what was taken and not replayed
	callCtx := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, o.cfg.Timeout) }
	cctx, cancel := callCtx()
	q, err := passive(cctx, ch, src.queue)
	cancel()
	if err != nil {
		return 0, err
	}
	if err := ch.Tx(); err != nil {
		return 0, err
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, opt.Batch))
	res.Total, res.Scanned, res.Failed, res.Missing = res.Replayed+q.Messages, res.Replayed, map[string]int{}, 0
	in := &inspector{conn: conn}
	defer in.close()
	t := &txn{o: o, in: in, ch: ch, src: src, returns: returns, done: done, exists: map[route]bool{}, used: map[route]int{}, sent: map[string]amqp.Delivery{}}
	pace := pacer{rate: opt.Rate}
	if q.Messages == 0 {
		return 0, nil
	}
	tk, err := take(ctx, ch, src.queue, q.Messages)
	if err != nil {
		return 0, err
	}
	defer tk.close()
	for range q.Messages {
		cctx, cancel := callCtx()
		d, ok, err := tk.next(cctx)
		cancel()
		if err != nil {
			return 0, err
		}
		if !ok {
			break
		}
		res.Scanned++
		m := fromDelivery(0, d, src.work, false)
		if !opt.Filter.Match(m) || opt.Limit > 0 && res.Replayed+len(t.sent) >= opt.Limit {
			t.hold(d) // taken all the same: see browse
			continue
		}
		if done[identity(d)] {
			// Replayed by a transaction whose acks the broker had not applied when the
			// connection was lost (seen on RabbitMQ 4.0.5): remove it, do not send it again.
			if err := d.Ack(false); err != nil {
				return 0, err
			}
			t.settled = append(t.settled, d)
			continue
		}
		r, why := routeOf(m, d, opt.To)
		if why == "" {
			if why, err = t.check(ctx, r); err != nil {
				return 0, err
			}
			if why != "" {
				res.Missing++
			}
		}
		if why != "" {
			res.Failed[why]++
			t.hold(d)
			continue
		}
		if err := pace.wait(ctx); err != nil {
			return 0, err
		}
		if err := t.send(ctx, r, d); err != nil {
			return 0, err
		}
		if len(t.sent) == opt.Batch {
			if err := t.commit(callCtx, res, opt.Progress); err != nil {
				return 0, err
			}
		}
	}
	if err := t.commit(callCtx, res, opt.Progress); err != nil {
		return 0, err
	}
	cctx, cancel = callCtx()
	for _, d := range tk.stop(cctx) { // delivered after the last one looked at
		t.hold(d)
	}
	cancel()
	return t.held, t.handBack(callCtx)
}

// route is where a replayed message goes: a queue (exchange "") or an exchange and key.
type route struct{ exchange, key string }

func (r route) String() string {
	if r.exchange == "" {
		return "queue " + r.key
	}
	return "exchange " + r.exchange
}

// routeOf is where m (read from d) goes, or why it cannot be replayed.
func routeOf(m Message, d amqp.Delivery, to string) (route, string) {
	switch {
	case m.Unreadable:
		return route{}, "headers unreadable: it cannot be replayed as it was"
	case to != "":
		return route{key: to}, ""
	case d.Headers[warren.DestExchangeHeader] != nil && m.Destination != "":
		return route{exchange: warren.HeaderString(d.Headers[warren.DestExchangeHeader]), key: d.RoutingKey}, ""
	case m.Destination != "":
		if why := notDestination(m.Destination); why != "" {
			return route{}, "queue " + m.Destination + " " + why
		}
		return route{key: m.Destination}, ""
	}
	return route{}, "no destination: it came from no delay or work queue"
}

// parkingQueue matches the name of the parking queue of any delay levels (see
// topology.Delay.ParkingQueue).
var parkingQueue = regexp.MustCompile(`\.(?:` + string(topology.Quorum) + `|` + string(topology.Classic) + `)\.\d+ms\.r\d+\.parked$`)

// notDestination says why a replay cannot send messages to queue ("" if it can): a poison
// queue (topology.PoisonQueue) or the parking queue of delay levels, where a replayed message
// would be no failure and no delayed message: it would lose its reason, error and handler, and
// be replayed again from there.
func notDestination(queue string) string {
	switch {
	case strings.HasSuffix(queue, topology.PoisonQueue("")):
		return "is a poison queue, not a destination"
	case parkingQueue.MatchString(queue):
		return "is the parking queue of delay levels, not a destination"
	}
	return ""
}

// txn is the transaction of a replay pass.
type txn struct {
	o       *Ops
	ch      *amqp.Channel
	src     source
	returns <-chan amqp.Return
	in      *inspector               // checks destinations
	exists  map[route]bool           // destinations checked in this pass
	used    map[route]int            // messages sent to each destination in this transaction
	sent    map[string]amqp.Delivery // publish id → original, in this transaction
	last    uint64                   // delivery tag of the last message held
	held    int                      // messages taken and not replayed
	done    map[string]bool          // identities of the messages replayed by this replay
	settled []amqp.Delivery          // replayed ones found again, acked in this transaction
}

// identity tells one message of a poison or parking queue from every other: its publish id
// (warren's DLX publisher gives every publish its own), else its id, body and headers.
func identity(d amqp.Delivery) string {
	if id := warren.HeaderString(d.Headers[warren.PublishIDHeader]); id != "" {
		return "p:" + id
	}
	h := sha256.New()
	fmt.Fprintf(h, "%q\x00%q\x00", d.MessageId, d.Body)
	keys := slices.Sorted(maps.Keys(d.Headers))
	for _, k := range keys {
		if k != warren.XDeliveryCountHeader {
			fmt.Fprintf(h, "%q=%q\x00", k, warren.HeaderString(d.Headers[k]))
		}
	}
	return "h:" + hex.EncodeToString(h.Sum(nil))
}

// hold keeps d, taken and not replayed, to hand it back.
func (t *txn) hold(d amqp.Delivery) {
	t.last, t.held = d.DeliveryTag, t.held+1
}

// handBack returns every message taken and not replayed to the queue at once, in order
// (closing the channel would too, but in an order of the broker's choosing).
func (t *txn) handBack(callCtx func() (context.Context, context.CancelFunc)) error {
	if t.last == 0 {
		return nil
	}
	ctx, cancel := callCtx()
	defer cancel()
	if err := t.ch.Nack(t.last, true, true); err != nil {
		return err
	}
	if err := amqpx.Do(ctx, t.ch, t.ch.TxCommit); err != nil {
		return err
	}
	settle(ctx, t.ch, t.src.queue, t.held, t.o.cfg.Timeout)
	return nil
}

// check says why r cannot take messages ("" if it can); it looks once per pass.
func (t *txn) check(ctx context.Context, r route) (string, error) {
	ok, known := t.exists[r]
	if !known {
		var err error
		if ok, err = t.exist(ctx, r); err != nil {
			return "", err
		}
		t.exists[r] = ok
	}
	if !ok {
		return r.String() + " does not exist", nil
	}
	return "", nil
}

// exist asks the broker whether r exists.
func (t *txn) exist(ctx context.Context, r route) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, t.o.cfg.Timeout)
	defer cancel()
	_, ok, err := t.in.inspect(ctx, r)
	return ok, err
}

// send publishes the copy of d to r and acknowledges d, both within the transaction.
func (t *txn) send(ctx context.Context, r route, d amqp.Delivery) error {
	id := strconv.FormatUint(rand.Uint64(), 16)
	h, expiration := replayHeaders(d)
	h[warren.PublishIDHeader] = id
	err := t.ch.PublishWithContext(ctx, r.exchange, r.key, true, false, amqp.Publishing{
		Headers: h, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: amqp.Persistent,
		Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, Expiration: expiration,
		MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body,
	})
	if err != nil {
		return err
	}
	if err := d.Ack(false); err != nil {
		return err
	}
	t.sent[id] = d
	t.used[r]++
	return nil
}

// commit checks the destinations again, commits, and puts back what the broker returned.
func (t *txn) commit(callCtx func() (context.Context, context.CancelFunc), res *ReplayResult, progress func(ReplayResult)) error {
	if len(t.sent) == 0 && len(t.settled) == 0 {
		return nil
	}
	ctx, cancel := callCtx()
	defer cancel()
	for r := range t.used {
		ok, err := t.exist(ctx, r)
		if err != nil {
			return err
		}
		if !ok {
			return amqpx.GiveUp(fmt.Errorf("%s was deleted during the replay; the %d messages of this transaction are left in %s", r, len(t.sent), t.src.queue))
		}
	}
	if err := amqpx.Do(ctx, t.ch, t.ch.TxCommit); err != nil {
		return err
	}
	res.Replayed += len(t.sent)
	for _, d := range t.sent {
		t.done[identity(d)] = true
	}

	t.settled = t.settled[:0]
	for drained := false; !drained; {
		select {
		case ret := <-t.returns:
			if err := t.putBack(ctx, ret, res); err != nil {
				return err
			}
		default:
			drained = true
		}
	}
	source := telemetry.RedriveFromPoison
	if t.src.work == "" {
		source = telemetry.RedriveFromParked
	}
	for r, n := range t.used {
		if dest := cmp.Or(r.exchange, r.key); n > 0 {
			t.o.redrives.Add(ctx, dest, source, n)
		}
	}
	clear(t.sent)
	clear(t.used)
	if progress != nil {
		progress(*res)
	}
	return nil
}

// putBack publishes the original of a copy that the broker returned (its destination was
// deleted between the check and the commit) to the tail of the queue it came from.
func (t *txn) putBack(ctx context.Context, ret amqp.Return, res *ReplayResult) error {
	d, ok := t.sent[warren.HeaderString(ret.Headers[warren.PublishIDHeader])]
	if !ok {
		return nil
	}
	err := t.ch.PublishWithContext(ctx, "", t.src.queue, false, false, amqp.Publishing{
		Headers: d.Headers, ContentType: d.ContentType, ContentEncoding: d.ContentEncoding, DeliveryMode: amqp.Persistent,
		Priority: d.Priority, CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, Expiration: d.Expiration,
		MessageId: d.MessageId, Timestamp: d.Timestamp, Type: d.Type, AppId: d.AppId, Body: d.Body,
	})
	if err == nil {
		err = amqpx.Do(ctx, t.ch, t.ch.TxCommit)
	}
	if err != nil {
		return fmt.Errorf("put back message %s, returned by the broker (%s): %w", warren.DeliveryID(d), ret.ReplyText, err)
	}
	res.Replayed--
	t.used[route{exchange: ret.Exchange, key: ret.RoutingKey}]--
	res.Failed["returned by the broker ("+ret.ReplyText+"): put back at the tail"]++
	return nil
}

// pacer keeps a rate of calls per second (none if rate is 0).
type pacer struct {
	rate float64
	next time.Time
}

func (p *pacer) wait(ctx context.Context) error {
	if p.rate <= 0 {
		return nil
	}
	now := time.Now()
	if p.next.Before(now) {
		p.next = now
	}
	wait := time.Until(p.next)
	p.next = p.next.Add(time.Duration(float64(time.Second) / p.rate))
	if wait <= 0 {
		return nil
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
