// Package ledger lists and cancels delayed messages that were published with a schedule id
// (dlx.Schedule), across processes and restarts, with nothing but the broker.
//
// The ledger of a delay layout is a RabbitMQ stream (topology.Delay.LedgerQueue): an
// append-only log, durable and replicated, that any number of readers read from the start
// without taking anything out. Three kinds of record go into it: the DLX publisher appends
// "scheduled" (id, destination, due time) for each such message before publishing it;
// Cancel appends "cancelled"; Middleware appends "delivered" when the message arrives at a
// warren consumer. The stream orders them all, and for each id the first of "cancelled" and
// "delivered" wins: Middleware acks a message whose cancellation came first without handling
// it, and Cancel says ErrDelivered when the delivery came first. Each side appends its
// record, then reads the stream up to it, so both see the same order.
//
// An id is any string of bytes a message can carry, NUL and bytes that are not UTF-8
// included, and the ledger keeps it byte for byte: the records are JSON, and beside an id
// that a JSON string cannot hold exactly they carry its bytes in base64 (id_base64; Entry's
// JSON too).
//
// A Ledger reads the stream from its start when it is made (and when it reconnects), and
// keeps the ids in memory: about 100 bytes per scheduled message within the stream's
// retention (3700 days). Listing reads the ledger, never the delay levels: their order and
// timing are not disturbed. See docs/scheduling.md.
package ledger

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/killstate"
	"github.com/warrenmq/warren/internal/msjson"
	"github.com/warrenmq/warren/topology"
)

// Errors of Cancel.
var (
	// ErrDelivered: the message reached a warren consumer before the cancellation.
	ErrDelivered = errors.New("ledger: the message was delivered before the cancellation")
	// ErrUnknown: no message was scheduled under the id (within the ledger's retention). The
	// cancellation is recorded all the same: a message with that id that arrives later is
	// not handled.
	ErrUnknown = errors.New("ledger: no message is scheduled under this id")
)

// Config configures a Ledger.
type Config struct {
	// Connection says how to reach the broker (URL required).
	Connection warren.Connection
	// Delay is the delay layout whose ledger this is: the one the publishers use.
	Delay topology.Delay
	// Timeout bounds Cancel, List and the check of each arriving message, connecting and
	// reading included. Default 30s.
	Timeout time.Duration
}

// DefaultTimeout is Config.Timeout's default.
const DefaultTimeout = 30 * time.Second

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	c.Connection = c.Connection.WithDefaults()
	c.Delay = c.Delay.WithDefaults()
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	return c
}

// Validate reports the first field of c that is not usable.
func (c Config) Validate() error {
	c = c.WithDefaults()
	if err := c.Connection.Validate(); err != nil {
		return fmt.Errorf("ledger: Config.%w", err)
	}
	if err := c.Delay.Validate(); err != nil {
		return fmt.Errorf("ledger: Config.Delay: %w", err)
	}
	if c.Delay.Disabled {
		return errors.New("ledger: Config.Delay is disabled: there are no delayed messages")
	}
	if c.Timeout < 0 {
		return fmt.Errorf("ledger: Config.Timeout %s is negative", c.Timeout)
	}
	return nil
}

// Entry is a message that waits: scheduled, neither cancelled nor delivered yet.
type Entry struct {
	// ID is the schedule id, byte for byte as the message carries it. In JSON it is id, and
	// also id_base64 (its bytes in standard base64) when it is not valid UTF-8 or holds
	// U+FFFD, which a JSON string cannot keep apart: UnmarshalJSON takes id_base64 when
	// present.
	ID string `json:"id"`
	// Exchange and Queue: where it goes (Queue when published to a queue).
	Exchange   string `json:"exchange,omitempty"`
	Queue      string `json:"queue,omitempty"`
	RoutingKey string `json:"routing_key,omitempty"`
	// Due is when it is due; Scheduled when it was published.
	Due       time.Time `json:"due"`
	Scheduled time.Time `json:"scheduled"`
}

// MarshalJSON writes e with id_base64 beside id when JSON cannot hold the id exactly (see
// Entry.ID).
func (e Entry) MarshalJSON() ([]byte, error) {
	type plain Entry
	return msjson.Marshal(struct {
		plain
		IDBase64 string `json:"id_base64,omitempty"`
	}{plain(e), idBase64(e.ID)})
}

// UnmarshalJSON reads what MarshalJSON writes: the id is id_base64 when present, else id.
func (e *Entry) UnmarshalJSON(data []byte) error {
	type plain Entry
	v := struct {
		*plain
		IDBase64 string `json:"id_base64"`
	}{plain: (*plain)(e)}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	if v.IDBase64 != "" {
		id, err := base64.StdEncoding.DecodeString(v.IDBase64)
		if err != nil {
			return fmt.Errorf("ledger: entry id_base64: %w", err)
		}
		e.ID = string(id)
	}
	return nil
}

// Destination is the queue, or the exchange, of e.
func (e Entry) Destination() string {
	if e.Queue != "" {
		return e.Queue
	}
	return e.Exchange
}

// Reading the stream: up to prefetch records in flight, acked every ackEvery.
const (
	prefetch = 2000
	ackEvery = 500
)

// Ops of the records.
const (
	opScheduled = "scheduled"
	opCancelled = "cancelled"
	opDelivered = "delivered"
	opMark      = "mark" // appended by List, to know where the stream's end was
)

// record is one entry of the stream. Its id is IDBase64 when set, else ID (see exactID).
type record struct {
	Op       string    `json:"op"`
	ID       string    `json:"id,omitempty"`
	IDBase64 string    `json:"id_base64,omitempty"`
	Token    string    `json:"token,omitempty"`
	Entry    *Entry    `json:"entry,omitempty"`
	At       time.Time `json:"at"`
}

// newRecord is a record of op for id, appended now.
func newRecord(op, id string) record {
	return record{Op: op, ID: id, IDBase64: idBase64(id), At: time.Now().UTC()}
}

// ScheduledRecord is the body of the "scheduled" record of e, which the DLX publisher
// appends to the ledger before it publishes the message.
func ScheduledRecord(e Entry) []byte {
	body, _ := msjson.Marshal(record{Op: opScheduled, ID: e.ID, IDBase64: idBase64(e.ID), Entry: &e, At: e.Scheduled})
	return body
}

// An id is any string of bytes a message carries (warren.MetadataScheduleID is a header, an
// AMQP long string). JSON strings hold valid UTF-8 only: encoding/json writes each byte that
// is not UTF-8 as U+FFFD, so "a\xff" and "a\xfe" would both be read back as "a\ufffd". A
// record and an Entry therefore carry, beside the id as JSON writes it, the id's exact bytes
// in base64 (id_base64) whenever JSON would not keep it: when it is not valid UTF-8, or holds
// U+FFFD itself. A reader takes id_base64 when present, else id, which is then exact. Records
// written without id_base64 by earlier versions are read as written (see legacy).

// idBase64 is id in standard base64 when JSON cannot hold it exactly (see above), else "".
func idBase64(id string) string {
	if utf8.ValidString(id) && !strings.ContainsRune(id, utf8.RuneError) {
		return ""
	}
	return base64.StdEncoding.EncodeToString([]byte(id))
}

// exactID returns the id of r, and false when its id_base64 is not base64 (a record warren
// did not write: skipped).
func (r record) exactID() (string, bool) {
	if r.IDBase64 == "" {
		return r.ID, true
	}
	b, err := base64.StdEncoding.DecodeString(r.IDBase64)
	return string(b), err == nil
}

// legacy reports whether a record of id, read without id_base64, may have lost bytes: an
// earlier version wrote each byte of an id that is not UTF-8 as U+FFFD, with no exact copy.
// Since id_base64 is written for every id holding U+FFFD, a record without it whose id holds
// U+FFFD was written so (or forged).
func legacy(r record) bool {
	return r.IDBase64 == "" && strings.ContainsRune(r.ID, utf8.RuneError)
}

// lossy is id as encoding/json writes it: each byte that is not UTF-8 becomes U+FFFD.
func lossy(id string) string {
	var b strings.Builder
	for _, r := range id { // a byte that is not UTF-8 ranges as one utf8.RuneError
		b.WriteRune(r)
	}
	return b.String()
}

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

// Ledger reads a delay layout's ledger and appends to it.
type Ledger struct {
	cfg    Config
	logger watermill.LoggerAdapter
	queue  string
	dialer *amqpx.Dialer

	mu      sync.Mutex
	ids     map[string]*idState
	aliases map[string]string // an exact id to its legacy form (see Ledger.state)
	waiters map[string]chan outcome
	conf    *amqpx.Confirmer // the current connection's, for appending; nil while none
	ready   chan struct{}    // closed, and replaced, when conf is set
	reads   int              // how many times ids was read from the start

	cancel context.CancelFunc
	done   chan struct{}
}

// New returns a Ledger that follows the ledger of config.Delay, or an error naming the first
// invalid field of config. It connects (and declares the stream) in the background; a call
// waits for it, up to Config.Timeout.
func New(config Config, logger watermill.LoggerAdapter) (*Ledger, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config = config.WithDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Ledger{cfg: config, logger: logger, queue: config.Delay.LedgerQueue(), waiters: map[string]chan outcome{},
		ready: make(chan struct{}), cancel: cancel, done: make(chan struct{}),
		// The reader logs each lost connection itself (run), and OnEvent is told of it.
		dialer: amqpx.NewDialer(config.Connection, "warren ledger", logger).OwnerReportsLoss()}
	go l.run(ctx)
	return l, nil
}

// Close stops following the ledger. Calls under way fail with warren.ErrClosed.
func (l *Ledger) Close() error {
	l.cancel()
	<-l.done
	return nil
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

// append appends a record of op for id with a token of its own, and waits until the reader
// has read it: what it found then.
func (l *Ledger) append(ctx context.Context, op, id string) (outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	token := killstate.NewID()
	found := make(chan outcome, 1)
	l.mu.Lock()
	l.waiters[token] = found
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.waiters, token)
		l.mu.Unlock()
	}()
	r := newRecord(op, id)
	r.Token = token
	body, _ := msjson.Marshal(r)
	err := amqpx.Retry(ctx, l.cfg.Timeout, "ledger: append", func(ctx context.Context) error {
		l.mu.Lock()
		conf, ready := l.conf, l.ready
		l.mu.Unlock()
		if conf == nil {
			select {
			case <-ready:
				return errors.New("connecting") // retried with the new connection
			case <-l.done:
				return amqpx.GiveUp(warren.ErrClosed)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		f, err := conf.Publish(ctx, "", l.queue, true, amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: body})
		if err != nil {
			return err
		}
		return f.Wait(ctx)
	})
	if err != nil {
		return outcome{}, fmt.Errorf("ledger: append to %s: %w", l.queue, err)
	}
	select {
	case o := <-found:
		return o, nil
	case <-l.done:
		return outcome{}, warren.ErrClosed
	case <-ctx.Done():
		return outcome{}, fmt.Errorf("ledger: read %s up to the record appended: %w", l.queue, ctx.Err())
	}
}

// Cancel makes sure the message scheduled under id is never handled by a warren consumer
// (one whose handlers have Middleware): nil once the cancellation is in the ledger before
// any delivery of it, ErrDelivered if the message arrived first, ErrUnknown if nothing was
// scheduled under id (the cancellation stands all the same). Cancelling twice is nil. A
// cancellation is final: a message scheduled under the same id later is not handled either.
func (l *Ledger) Cancel(ctx context.Context, id string) error {
	if id == "" {
		return errors.New("ledger: Cancel: the id is empty")
	}
	if len(id) > amqpx.MaxHeaderFrame { // its record could exceed the broker's message size
		return fmt.Errorf("ledger: Cancel: an id of %d bytes: no message can carry one over %d", len(id), amqpx.MaxHeaderFrame)
	}
	o, err := l.append(ctx, opCancelled, id)
	switch {
	case err != nil:
		return err
	case o.decided == opDelivered:
		return fmt.Errorf("%w: %s", ErrDelivered, id)
	case !o.known:
		return fmt.Errorf("%w: %s (the cancellation is recorded)", ErrUnknown, id)
	}
	return nil
}

// Filter selects entries for List: all of them when zero.
type Filter struct {
	// Destination: only messages to this queue or exchange.
	Destination string
	// Before: only messages due before this time.
	Before time.Time
}

// List returns the messages that wait (scheduled, neither cancelled nor delivered), as of
// now, sorted by due time. A message that is due but was not consumed by a warren consumer
// (its queue has no consumer, or a foreign one) is listed until it is.
func (l *Ledger) List(ctx context.Context, f Filter) ([]Entry, error) {
	for {
		o, err := l.append(ctx, opMark, "") // read everything appended before now
		if err != nil {
			return nil, err
		}
		l.mu.Lock()
		if o.reads == l.reads {
			break // (locked) the ids are those read up to the mark
		}
		l.mu.Unlock() // the reader started again from the start since: a mark of the new read
	}
	var entries []Entry
	for _, s := range l.ids {
		e := s.entry
		if e == nil || (f.Destination != "" && e.Destination() != f.Destination) || (!f.Before.IsZero() && !e.Due.Before(f.Before)) {
			continue
		}
		entries = append(entries, *e)
	}
	l.mu.Unlock()
	slices.SortFunc(entries, func(a, b Entry) int {
		if c := a.Due.Compare(b.Due); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return entries, nil
}

// Middleware checks each message that carries a schedule id (warren.MetadataScheduleID)
// against the ledger: it records the delivery and handles the message, unless a
// cancellation came first, in which case the message is acked unhandled. Messages without
// a schedule id pass untouched. Put it in router.HandlerConfig.Middleware: inside Backoff, a
// ledger that cannot be reached within Config.Timeout is a failure of the handler, retried.
func (l *Ledger) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		id := msg.Metadata.Get(warren.MetadataScheduleID)
		if id == "" {
			return h(msg)
		}
		o, err := l.append(msg.Context(), opDelivered, id)
		if err != nil {
			return nil, err
		}
		if o.decided == opCancelled {
			l.logger.Info("Message cancelled: acked, not handled", watermill.LogFields{"schedule_id": id, "message_uuid": msg.UUID})
			return nil, nil
		}
		return h(msg)
	}
}
