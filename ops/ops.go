package ops

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/metric"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpurl"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/mgmt"
	"github.com/warrenmq/warren/internal/telemetry"
	"github.com/warrenmq/warren/ledger"
	"github.com/warrenmq/warren/topology"
)

// Config configures Ops.
type Config struct {
	// Connection says how to reach the broker (URL required).
	Connection warren.Connection
	// Delay is the layout of the delay levels that Status and the parked messages are about;
	// the library's default levels unless set (topology.Delay's defaults).
	Delay topology.Delay
	// KillSecret names the kill state queues when consumers use a secret (see
	// kill.StateQueue).
	KillSecret []byte
	// Timeout bounds each broker call, retries included. Default DefaultTimeout. Connecting
	// is also bounded by Connection.ConnectTimeout.
	Timeout time.Duration
	// MeterProvider records warren.redrives (the messages replayed); nil means the global
	// one (otel.GetMeterProvider()).
	MeterProvider metric.MeterProvider
	// Management is the URL of RabbitMQ's management HTTP API (the rabbitmq_management
	// plugin) with a user's credentials, e.g. http://guest:guest@127.0.0.1:15672/; optional.
	// With it Status also reports queue states, unacknowledged messages, the messages a
	// level is dead-lettering, the hosts of consumers and the broker's nodes and policies
	// (Status.Broker; the nodes need a user with the monitoring tag), WorkQueues lists
	// warren's work queues, and CheckFileHandles counts. No error shows its password.
	Management string
}

// DefaultTimeout is the default of Config.Timeout.
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

// Validate reports the first field of c that is not usable. No error contains a password of
// Config.Connection.URL.
func (c Config) Validate() error {
	if err := c.Connection.Validate(); err != nil {
		return fmt.Errorf("ops: Config.%w", err)
	}
	if err := c.Delay.Validate(); err != nil {
		return fmt.Errorf("ops: Config.Delay: %w", err)
	}
	if c.Timeout < 0 {
		return fmt.Errorf("ops: Config.Timeout %s is negative", c.Timeout)
	}
	if c.Management != "" {
		if _, err := mgmt.New(c.Management); err != nil {
			return fmt.Errorf("ops: Config.Management: %w", err)
		}
	}
	return nil
}

// Ops reads and operates what warren puts on the broker. Its methods may be called
// concurrently; they share one connection, opened on first use and again after it is lost.
type Ops struct {
	cfg      Config
	logger   watermill.LoggerAdapter
	dialer   *amqpx.Dialer
	redrives *telemetry.Redrives
	mgmt     *mgmt.Client // nil without Config.Management
	vhost    string       // of Config.Connection, for the management API

	mu     sync.Mutex
	conn   *amqp.Connection
	ledger *ledger.Ledger // made on first use by Scheduled or Cancel
	closed bool
}

// New returns an Ops, or an error naming the first invalid field of config. It connects on
// first use.
func New(config Config, logger watermill.LoggerAdapter) (*Ops, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	config = config.WithDefaults()
	redrives, err := telemetry.NewRedrives(config.MeterProvider)
	if err != nil {
		return nil, err
	}
	conn := config.Connection
	conn.ConnectTimeout = min(conn.ConnectTimeout, config.Timeout) // connecting is part of a call
	o := &Ops{cfg: config, logger: logger, dialer: amqpx.NewDialer(conn, "warren ops", logger), redrives: redrives, vhost: "/"}
	if config.Management != "" {
		o.mgmt, _ = mgmt.New(config.Management) // checked by Validate
	}
	if uri, err := amqp.ParseURI(amqpurl.Split(config.Connection.URL)[0]); err == nil {
		o.vhost = uri.Vhost
	}
	return o, nil
}

// errOpsClosed is the error of a method of an Ops that is closed.
var errOpsClosed = fmt.Errorf("ops: %w", warren.ErrClosed)

// Close closes the connection. The calls in progress fail.
func (o *Ops) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	if o.mgmt != nil {
		o.mgmt.Close()
	}
	if o.ledger != nil {
		_ = o.ledger.Close()
	}
	return amqpx.Close(o.conn)
}

// theLedger returns the ledger of the delay levels, following it from the first call on.
func (o *Ops) theLedger() (*ledger.Ledger, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, warren.ErrClosed
	}
	if o.ledger == nil {
		l, err := ledger.New(ledger.Config{Connection: o.cfg.Connection, Delay: o.cfg.Delay, Timeout: o.cfg.Timeout}, o.logger)
		if err != nil {
			return nil, err
		}
		o.ledger = l
	}
	return o.ledger, nil
}

// Scheduled lists the delayed messages published with a schedule id (warren.Schedule) that
// wait, from the ledger of the delay levels: see ledger.Ledger.List. The levels are not
// read.
func (o *Ops) Scheduled(ctx context.Context, f ledger.Filter) ([]ledger.Entry, error) {
	l, err := o.theLedger()
	if err != nil {
		return nil, err
	}
	return l.List(ctx, f)
}

// Cancel cancels the message scheduled under id: see ledger.Ledger.Cancel. id is the exact
// id, byte for byte (ledger.Entry.ID as Scheduled returns it): a form or a command line that
// shows ids must give back the bytes it was given, NUL and bytes that are not UTF-8 included.
func (o *Ops) Cancel(ctx context.Context, id string) error {
	l, err := o.theLedger()
	if err != nil {
		return err
	}
	return l.Cancel(ctx, id)
}

// connection returns the open connection, dialling it (with retries, for up to
// Connection.ConnectTimeout or Timeout, whichever is shorter; a refusal is not retried) if
// there is none.
func (o *Ops) connection(ctx context.Context) (*amqp.Connection, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, errOpsClosed
	}
	if o.conn != nil && !o.conn.IsClosed() {
		return o.conn, nil
	}
	conn, err := o.dialer.Connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("ops: %w", err)
	}
	o.conn = conn
	return conn, nil
}

// call runs op on a channel of its own (a refusal closes the channel it comes on), for up to
// Timeout, retrying after a lost connection. what names the call in errors.
func (o *Ops) call(ctx context.Context, what string, op func(ctx context.Context, ch *amqp.Channel) error) error {
	return o.onConnection(ctx, what, func(ctx context.Context, conn *amqp.Connection) error {
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		defer func() { _ = ch.Close() }()
		return op(ctx, ch)
	})
}

// onConnection runs op with the connection, for up to Timeout, retrying after a lost
// connection, as call does, for an op that opens the channels it needs.
func (o *Ops) onConnection(ctx context.Context, what string, op func(ctx context.Context, conn *amqp.Connection) error) error {
	if _, err := o.connection(ctx); err != nil { // its own Timeout, before op's
		return fmt.Errorf("%s: %w", what, err)
	}
	return amqpx.RetryLogged(ctx, o.cfg.Timeout, what, o.logger, nil, func(ctx context.Context) error {
		conn, err := o.connection(ctx)
		if err != nil {
			return amqpx.GiveUp(err) // connection retried already
		}
		stop := amqpx.Watch(ctx, conn)
		defer stop()
		return amqpx.GiveUpIfRefused(op(ctx, conn))
	})
}

// inspector asks the broker whether queues and exchanges exist, with passive declares on one
// channel that it opens again after a "not found" has closed it.
type inspector struct {
	conn *amqp.Connection
	ch   *amqp.Channel
}

// inspect returns r's queue (for an exchange, nothing but whether it exists), and whether it
// exists.
func (in *inspector) inspect(ctx context.Context, r route) (amqp.Queue, bool, error) {
	if in.ch == nil || in.ch.IsClosed() {
		ch, err := in.conn.Channel()
		if err != nil {
			return amqp.Queue{}, false, err
		}
		in.ch = ch
	}
	ch := in.ch
	var q amqp.Queue
	err := amqpx.Do(ctx, ch, func() (err error) {
		if r.exchange != "" {
			return ch.ExchangeDeclarePassive(r.exchange, amqp.ExchangeHeaders, true, false, false, false, nil)
		}
		q, err = ch.QueueDeclarePassive(r.key, true, false, false, false, nil)
		return err
	})
	if amqpx.IsNotFound(err) {
		return q, false, nil
	}
	return q, err == nil, err
}

func (in *inspector) close() {
	if in.ch != nil {
		_ = in.ch.Close()
	}
}

// Verify reports how the broker differs from the topology file f: what is missing, what exists
// with other arguments, and whether it dead-letters as the delay levels need (see
// topology.Builder.Verify, which declares nothing but a probe queue that it deletes).
func (o *Ops) Verify(ctx context.Context, f topology.File) (topology.Report, error) {
	b, err := topology.NewBuilder(f.Config, o.logger)
	if err != nil {
		return topology.Report{}, fmt.Errorf("ops: verify: %w", err)
	}
	return b.Verify(ctx, o.cfg.Connection, f.Topology)
}
