// Package ledger lists and cancels delayed messages that were published with a schedule id
// (warren.Schedule), across processes and restarts, with nothing but the broker.
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
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/msjson"
	"github.com/warrenmq/warren/internal/statequeue"
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

// append appends a record of op for id with a token of its own, and waits until the reader
// has read it: what it found then.
func (l *Ledger) append(ctx context.Context, op, id string) (outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	defer cancel()
	token := statequeue.NewID()
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
