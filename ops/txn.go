package ops

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/telemetry"
)

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
	if id := contract.HeaderString(d.Headers[contract.PublishIDHeader]); id != "" {
		return "p:" + id
	}
	h := sha256.New()
	fmt.Fprintf(h, "%q\x00%q\x00", d.MessageId, d.Body)
	keys := slices.Sorted(maps.Keys(d.Headers))
	for _, k := range keys {
		if k != warren.XDeliveryCountHeader {
			fmt.Fprintf(h, "%q=%q\x00", k, contract.HeaderString(d.Headers[k]))
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
func (t *txn) handBack(call callCtx) error {
	if t.last == 0 {
		return nil
	}
	ctx, cancel := call()
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
	h[contract.PublishIDHeader] = id
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
func (t *txn) commit(call callCtx, res *ReplayResult, progress func(ReplayResult)) error {
	if len(t.sent) == 0 && len(t.settled) == 0 {
		return nil
	}
	ctx, cancel := call()
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
	d, ok := t.sent[contract.HeaderString(ret.Headers[contract.PublishIDHeader])]
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
		return fmt.Errorf("put back message %s, returned by the broker (%s): %w", contract.DeliveryID(d), ret.ReplyText, err)
	}
	res.Replayed--
	t.used[route{exchange: ret.Exchange, key: ret.RoutingKey}]--
	res.Failed["returned by the broker ("+ret.ReplyText+"): put back at the tail"]++
	return nil
}
