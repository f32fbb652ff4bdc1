package amqpx

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
)

// Dialer opens the connections of one component (one after the other: a connection, then
// another once it is lost) and reports them: to Connection.OnEvent and to the logger,
// connected, reconnecting (lost) and failed over (connected again, to another node).
type Dialer struct {
	conn   warren.Connection
	name   string
	logger watermill.LoggerAdapter

	quietLoss bool // the owner logs a lost connection: see OwnerReportsLoss

	mu   sync.Mutex
	last string // the node of the last connection
}

// NewDialer returns a Dialer of the connections named name (see Dial), opened as c says
// (its unset fields defaulted).
func NewDialer(c warren.Connection, name string, logger watermill.LoggerAdapter) *Dialer {
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Dialer{conn: c.WithDefaults(), name: name, logger: logger}
}

// Dial opens a connection (see the function Dial) and reports it; once it is lost other
// than by being closed, that is reported too. A refusal is an error marked by GiveUp, as Dial says,
// with one exception: once the Dialer has connected, a connection closed without a word
// after the login (amqp.ErrCredentials) is taken for a node that went down during the
// handshake, not for a changed password, and is not marked by GiveUp. The first
// connection of the process to a broker of a version that DeadLetterWarning warns about
// logs the warning (Info).
func (d *Dialer) Dial(ctx context.Context) (*amqp.Connection, error) {
	d.mu.Lock()
	connected := d.last != ""
	d.mu.Unlock()
	conn, node, err := dial(ctx, d.conn, d.name, !connected)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	previous := d.last
	d.last = node
	d.mu.Unlock()
	fields := watermill.LogFields{"connection": d.name, "node": node}
	ev := warren.ConnectionEvent{State: warren.Connected, Name: d.name, Node: node}
	if previous != "" && previous != node {
		ev.State, ev.Previous = warren.FailedOver, previous
		fields["previous"] = previous
	}
	d.logger.Info("Broker "+string(ev.State), fields)
	warnDeadLetter(d.logger, conn, fields)
	d.emit(ev)

	lost := conn.NotifyClose(make(chan *amqp.Error, 1))
	go func() { // ends when the connection does: amqp091 closes lost then
		if err, ok := <-lost; ok && err != nil {
			fields := watermill.LogFields{"connection": d.name, "node": node}
			if d.quietLoss {
				d.logger.Debug("Broker connection lost; reconnecting", fields.Add(watermill.LogFields{"err": err.Error()}))
			} else {
				d.logger.Error("Broker connection lost; reconnecting", err, fields)
			}
			d.emit(warren.ConnectionEvent{State: warren.Reconnecting, Name: d.name, Node: node, Err: err})
		}
	}()
	return conn, nil
}

// OwnerReportsLoss makes the Dialer log a lost connection at Debug, not as an error (it is
// still told to Connection.OnEvent), and returns it: for an owner that logs the failure of
// each of its calls itself (warren's subscriber, once per retry), to which a second line for
// the same failure would add nothing. Call it before Dial.
func (d *Dialer) OwnerReportsLoss() *Dialer {
	d.quietLoss = true
	return d
}

func (d *Dialer) emit(ev warren.ConnectionEvent) {
	if d.conn.OnEvent != nil {
		d.conn.OnEvent(ev)
	}
}

// Connect opens a connection (see Dialer.Dial), retrying a failure to connect (RetryLogged,
// told to the Dialer's logger) for up to the Connection's ConnectTimeout; a refusal ends it
// at once. The error says "connect" and, having given up, wraps the last failure, which
// names each node tried and why it failed.
func (d *Dialer) Connect(ctx context.Context) (conn *amqp.Connection, err error) {
	err = RetryLogged(ctx, d.conn.ConnectTimeout, "connect", d.logger, nil, func(ctx context.Context) error {
		c, err := d.Dial(ctx)
		conn = c
		return err
	})
	return conn, err
}

// ConnectWithin opens a connection for a call that RetryLogged with limit retries (ctx is its
// attempt's): when the Connection's ConnectTimeout is shorter than limit, it retries a failure
// to connect itself (see Connect) and marks its error by GiveUp, retried already; otherwise
// it dials once (see Dialer.Dial), and limit bounds connecting too.
func (d *Dialer) ConnectWithin(ctx context.Context, limit time.Duration) (*amqp.Connection, error) {
	if d.conn.ConnectTimeout >= limit {
		return d.Dial(ctx)
	}
	conn, err := d.Connect(ctx)
	if err != nil {
		return nil, GiveUp(err)
	}
	return conn, nil
}

// Run connects (see ConnectWithin) and runs op on the connection, retrying (RetryLogged, told
// to the Dialer's logger) a lost connection for up to limit; a broker refusal ends it. The
// connection is closed when op returns, and closed under op if ctx ends.
func (d *Dialer) Run(ctx context.Context, limit time.Duration, what string, op func(ctx context.Context, conn *amqp.Connection) error) error {
	return RetryLogged(ctx, limit, what, d.logger, nil, func(ctx context.Context) error {
		conn, err := d.ConnectWithin(ctx, limit)
		if err != nil {
			return err
		}
		defer func() { _ = Close(conn) }()
		stop := Watch(ctx, conn)
		defer stop()
		return GiveUpIfRefused(op(ctx, conn))
	})
}
