package ops

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/topology"
)

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

// callCtx returns a context for one call to the broker, bounded by Config.Timeout.
type callCtx func() (context.Context, context.CancelFunc)

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
	call := callCtx(func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, o.cfg.Timeout) })
	n, err := startPass(call, ch, src)
	if err != nil {
		return 0, err
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, opt.Batch))
	res.Total, res.Scanned, res.Failed, res.Missing = res.Replayed+n, res.Replayed, map[string]int{}, 0
	in := &inspector{conn: conn}
	defer in.close()
	t := &txn{o: o, in: in, ch: ch, src: src, returns: returns, done: done, exists: map[route]bool{}, used: map[route]int{}, sent: map[string]amqp.Delivery{}}
	if n == 0 {
		return 0, nil
	}
	tk, err := take(ctx, ch, src.queue, n)
	if err != nil {
		return 0, err
	}
	defer tk.close()
	if err := t.replayTaken(ctx, call, tk, n, opt, res); err != nil {
		return 0, err
	}
	cctx, cancel := call()
	for _, d := range tk.stop(cctx) { // delivered after the last one looked at
		t.hold(d)
	}
	cancel()
	return t.held, t.handBack(call)
}

// startPass counts the messages of src's queue and puts ch in transaction mode.
func startPass(call callCtx, ch *amqp.Channel, src source) (int, error) {
	cctx, cancel := call()
	q, err := passive(cctx, ch, src.queue)
	cancel()
	if err != nil {
		return 0, err
	}
	if err := ch.Tx(); err != nil {
		return 0, err
	}
	return q.Messages, nil
}

// replayTaken looks at the n messages tk takes, or as many as the queue still gives, one by
// one (replayOne), and commits what is left of the last transaction.
func (t *txn) replayTaken(ctx context.Context, call callCtx, tk *taker, n int, opt ReplayOptions, res *ReplayResult) error {
	pace := pacer{rate: opt.Rate}
	for range n {
		cctx, cancel := call()
		d, ok, err := tk.next(cctx)
		cancel()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		res.Scanned++
		if err := t.replayOne(ctx, call, d, &pace, opt, res); err != nil {
			return err
		}
	}
	return t.commit(call, res, opt.Progress)
}

// replayOne replays d within the transaction, committing it once it holds opt.Batch
// messages; or holds d (not selected, or it cannot be replayed); or removes d, when this
// replay replayed it already.
func (t *txn) replayOne(ctx context.Context, call callCtx, d amqp.Delivery, pace *pacer, opt ReplayOptions, res *ReplayResult) error {
	m := fromDelivery(0, d, t.src.work, false)
	if !opt.Filter.Match(m) || opt.Limit > 0 && res.Replayed+len(t.sent) >= opt.Limit {
		t.hold(d) // taken all the same: see browse
		return nil
	}
	if t.done[identity(d)] {
		// Replayed by a transaction whose acks the broker had not applied when the
		// connection was lost (seen on RabbitMQ 4.0.5): remove it, do not send it again.
		if err := d.Ack(false); err != nil {
			return err
		}
		t.settled = append(t.settled, d)
		return nil
	}
	r, why, err := t.destination(ctx, m, d, opt.To, res)
	if err != nil {
		return err
	}
	if why != "" {
		res.Failed[why]++
		t.hold(d)
		return nil
	}
	if err := pace.wait(ctx); err != nil {
		return err
	}
	if err := t.send(ctx, r, d); err != nil {
		return err
	}
	if len(t.sent) == opt.Batch {
		return t.commit(call, res, opt.Progress)
	}
	return nil
}

// destination is where m (read from d) goes, or why it cannot be replayed there; a
// destination that does not exist is counted in res.Missing.
func (t *txn) destination(ctx context.Context, m Message, d amqp.Delivery, to string, res *ReplayResult) (route, string, error) {
	r, why := routeOf(m, d, to)
	if why != "" {
		return r, why, nil
	}
	why, err := t.check(ctx, r)
	if err != nil {
		return r, "", err
	}
	if why != "" {
		res.Missing++
	}
	return r, why, nil
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
	case d.Headers[contract.DestExchangeHeader] != nil && m.Destination != "":
		return route{exchange: contract.HeaderString(d.Headers[contract.DestExchangeHeader]), key: d.RoutingKey}, ""
	case m.Destination != "":
		if why := notDestination(m.Destination); why != "" {
			return route{}, "queue " + m.Destination + " " + why
		}
		return route{key: m.Destination}, ""
	}
	return route{}, "no destination: it came from no delay or work queue"
}

// notDestination says why a replay cannot send messages to queue ("" if it can): a poison
// queue (topology.PoisonQueue) or the parking queue of delay levels, where a replayed message
// would be no failure and no delayed message: it would lose its reason, error and handler, and
// be replayed again from there.
func notDestination(queue string) string {
	_, parking := topology.ParseParkingQueue(queue) // the rule topology names them by
	switch {
	case strings.HasSuffix(queue, topology.PoisonQueue("")):
		return "is a poison queue, not a destination"
	case parking:
		return "is the parking queue of delay levels, not a destination"
	}
	return ""
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
