package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/topology"
)

// Reading the stream: up to prefetch records in flight, acked every ackEvery.
const (
	prefetch = 2000
	ackEvery = 500
)

// idState is what the ledger says of one id.
type idState struct {
	entry   *Entry // while it waits
	known   bool   // a "scheduled" record was read
	decided string // "", opCancelled or opDelivered: the first of them since it was scheduled
	legacy  bool   // a record that may have lost bytes of the id was read for it (see legacy)
}

// outcome is what the reader found when it read a record appended with a token.
type outcome struct {
	decided string
	known   bool
	reads   int // Ledger.reads then
}

// run follows the stream, connecting again (and reading it again from the start) when the
// connection is lost.
func (l *Ledger) run(ctx context.Context) {
	defer close(l.done)
	_ = amqpx.Reconnect(ctx, amqpx.HeldConnection, func(ctx context.Context, _ func()) error { return l.follow(ctx) },
		amqpx.LogEach(l.logger, "Ledger lost its connection; connecting again", watermill.LogFields{"ledger": l.queue}))
}

// follow connects, declares the stream and reads it from the start until the connection
// ends or ctx does.
func (l *Ledger) follow(ctx context.Context) error {
	conn, err := l.dialer.Dial(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = amqpx.Close(conn) }()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	// Opening the channels and confirm mode wait for the broker: bounded by Timeout and Close.
	dctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	stopWatch := amqpx.Watch(dctx, conn)
	deliveries, conf, err := l.open(dctx, conn)
	stopWatch()
	cancel()
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.ids, l.aliases = map[string]*idState{}, map[string]string{} // read again from the start
	l.reads++
	l.conf = conf
	close(l.ready)
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.conf = nil
		l.ready = make(chan struct{})
		l.mu.Unlock()
	}()
	unacked := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-closed:
			return fmt.Errorf("ledger: connection closed: %w", err)
		case <-conf.Done(): // the broker closed the channel appends go on
			return errors.New("ledger: the channel of appends was closed")
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("ledger: the broker cancelled the reader of " + l.queue)
			}
			var r record
			if json.Unmarshal(d.Body, &r) == nil {
				l.read(r)
			}
			// A stream counts acks as credit only: one for all read so far, when the
			// reader has caught up or every ackEvery records.
			if unacked++; unacked == ackEvery || len(deliveries) == 0 {
				if err := d.Ack(true); err != nil {
					return err
				}
				unacked = 0
			}
		}
	}
}

// open declares the stream and starts reading it from the start on a channel of conn, and
// opens another channel, in confirm mode, for appending.
func (l *Ledger) open(ctx context.Context, conn *amqp.Connection) (<-chan amqp.Delivery, *amqpx.Confirmer, error) {
	read, err := conn.Channel()
	if err != nil {
		return nil, nil, err
	}
	appendCh, err := conn.Channel()
	if err != nil {
		return nil, nil, err
	}
	var deliveries <-chan amqp.Delivery
	err = amqpx.Do(ctx, read, func() error {
		if err := topology.DeclareLedger(read, l.cfg.Delay); err != nil {
			return err
		}
		if err := read.Qos(prefetch, 0, false); err != nil { // a stream is read with a prefetch
			return err
		}
		var err error
		deliveries, err = read.Consume(l.queue, "", false, false, false, false, amqp.Table{"x-stream-offset": "first"})
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	conf, err := amqpx.NewConfirmer(appendCh)
	if err != nil {
		return nil, nil, err
	}
	return deliveries, conf, nil
}

// read applies r to the ids, and tells the caller that appended it what it found. A record
// of another op, or of no id, changes nothing: anyone who may publish to the default exchange
// can append to the stream.
func (l *Ledger) read(r record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	id, ok := r.exactID()
	var s *idState
	if ok && id != "" && (r.Op == opScheduled || r.Op == opCancelled || r.Op == opDelivered) {
		s = l.state(id, r)
	}
	switch {
	case s == nil:
	case r.Op == opScheduled && s.decided == opCancelled:
		// A cancellation stands: a message scheduled under its id after it (a cancel that
		// came first, or a publish retried after a cancel) is not handled either.
		s.known = true
	case r.Op == opScheduled:
		// Scheduled (again): a retry of a delivered message waits anew, and may be cancelled.
		s.known, s.decided, s.entry = true, "", r.Entry
		if s.entry != nil {
			s.entry.ID = id // the id it is listed, and cancelled, under
		}
	case (r.Op == opCancelled || r.Op == opDelivered) && s.decided == "":
		s.decided, s.entry = r.Op, nil
	}
	if w, ok := l.waiters[r.Token]; ok && r.Token != "" {
		delete(l.waiters, r.Token)
		o := outcome{reads: l.reads}
		if s != nil {
			o.decided, o.known = s.decided, s.known
		}
		w <- o
	}
}

// state returns the state of id, which record r is about, made if need be (l.mu held).
//
// Earlier versions recorded an id that is not UTF-8 under its lossy form (each such byte as
// U+FFFD), while the message carries, and arrives with, its exact id. So an exact id that has
// no records of its own stands for its lossy form when records of an earlier version were
// read for that form: its first record joins that state, and from then on both are one id,
// as they were before. A cancellation recorded by an earlier version then stops the message
// it was meant for, a cancellation of the form listed says the message was delivered, and a
// cancellation stays final. Ids that no earlier version recorded are kept apart.
func (l *Ledger) state(id string, r record) *idState {
	if alias, ok := l.aliases[id]; ok {
		id = alias
	}
	s := l.ids[id]
	if s == nil {
		if form := lossy(id); form != id {
			if old := l.ids[form]; old != nil && old.legacy {
				l.aliases[id] = form
				return old
			}
		}
		s = &idState{}
		l.ids[id] = s
	}
	if legacy(r) {
		s.legacy = true
	}
	return s
}
