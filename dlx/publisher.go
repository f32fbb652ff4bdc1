package dlx

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/metric"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/telemetry"
	"github.com/warrenmq/warren/topology"
)

// Publisher is a Watermill message.Publisher for RabbitMQ that can delay messages.
//
// A message without delay metadata is published at once. A delayed one (warren.Delay,
// warren.DeliverAt, or Watermill's components/delay metadata) travels through the delay
// levels of topology.Delay and reaches its destination with its routing key. Publish returns
// nil only once the broker has confirmed every message; a return (no queue took the message)
// is an error at once, and a nack is published again until the time limit, then an error that
// wraps ErrNacked. Many messages are in flight on the channel at once, whether from one
// Publish call or from many goroutines.
//
// A delayed message crosses the delay levels without its expiration and priority properties:
// they travel as the headers warren.MetadataExpiration and warren.MetadataPriority, which
// warren.Marshaler reads back into the same metadata (a per-message TTL would cut the wait
// short, a priority would hold other messages back on RabbitMQ 4.0).
type Publisher struct {
	cfg     Config
	logger  watermill.LoggerAdapter
	builder *topology.Builder
	conns   *amqpx.Conn // the connection: the publisher's own, or one it shares (see newPublisher)
	ownConn bool        // Close closes conns
	delay   topology.Delay
	metrics *telemetry.Instruments
	parked  metric.Registration // of warren.delay.parked; nil without delay levels

	attrsMu sync.RWMutex
	attrs   map[destination]*telemetry.Publish // the metrics' attribute sets, per destination

	ordered atomic.Bool // a queue with lanes is listed: Publish looks up every queue's lanes

	mu        sync.Mutex                   // guards the fields below
	queues    map[string]topology.Queue    // listed in Config.Declare or Declare, by name
	exchanges map[string]topology.Exchange // likewise
	conn      *amqp.Connection             // the connection conf and declared belong to
	conf      *amqpx.Confirmer
	declared  map[Route]bool // destinations declared on conn
	closed    bool

	opening   chan struct{} // one slot: held while connecting, waited for until the caller's deadline
	declaring chan struct{} // one slot: serialises declarations (on their own channel)
}

var _ message.Publisher = (*Publisher)(nil)

// NewPublisher connects to the broker and declares the delay levels and Config.Declare,
// retrying until Config.Connection.ConnectTimeout. The publisher has a connection of its own.
func NewPublisher(config Config, logger watermill.LoggerAdapter) (*Publisher, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config = config.WithDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	conns := amqpx.NewConn(amqpx.NewDialer(config.Connection, "warren dlx publisher", logger))
	return newPublisher(config, conns, true, true, logger)
}

// NewPublisherOn returns a publisher of config (validated and defaulted as NewPublisher does;
// Config.Connection's ConnectTimeout bounds declaring, while dialing is conn's) that
// publishes on conn, on a confirm channel of its own. It never closes conn, which its owner
// closes once every publisher on it is closed. With declare set it connects and declares the
// delay levels and Config.Declare now, and reports the warren.delay.parked gauge, as
// NewPublisher does; without, it does neither and connects at its first publish: for the
// publishers that share the connection of one that declared.
//
// conn is of an internal package: only warren's own packages call NewPublisherOn (a
// router's publishers share its publishing connection). A user's publisher has a connection
// of its own: see NewPublisher.
func NewPublisherOn(conn *amqpx.Conn, config Config, declare bool, logger watermill.LoggerAdapter) (*Publisher, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return newPublisher(config.WithDefaults(), conn, false, declare, logger)
}

// newPublisher returns a publisher of config (validated, defaulted) that publishes on conns,
// each publisher on a confirm channel of its own, and closes conns when it closes if own is
// set. With declare set it connects and declares the delay levels and Config.Declare now, and
// reports warren.delay.parked; without, it does neither (a publisher that shares the
// connection of one that did, see NewPublisherOn) and connects at its first publish.
func newPublisher(config Config, conns *amqpx.Conn, own, declare bool, logger watermill.LoggerAdapter) (*Publisher, error) {
	builder, err := topology.NewBuilder(config.Topology, logger)
	if err != nil {
		return nil, err
	}
	metrics, err := telemetry.New(config.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("dlx: %w", err)
	}
	p := &Publisher{
		cfg:       config,
		logger:    logger,
		builder:   builder,
		conns:     conns,
		ownConn:   own,
		delay:     builder.Delay(),
		metrics:   metrics,
		attrs:     map[destination]*telemetry.Publish{},
		queues:    map[string]topology.Queue{},
		exchanges: map[string]topology.Exchange{},
		declared:  map[Route]bool{},
		opening:   make(chan struct{}, 1),
		declaring: make(chan struct{}, 1),
	}
	if !declare {
		p.list(config.Declare)
		return p, nil
	}
	if err := p.declareWith(context.Background(), config.Declare, (*topology.Builder).Declare); err != nil {
		_ = p.Close()
		return nil, err
	}
	if !p.delay.Disabled {
		if p.parked, err = metrics.Parked(p.delay.ParkingQueue(), p.countParked); err != nil {
			_ = p.Close()
			return nil, fmt.Errorf("dlx: %w", err)
		}
	}
	return p, nil
}

// connect returns the open confirm channel, dialling (see amqpx.Conn.Get) and opening it
// when needed. One call at a time connects, without holding p.mu; the others wait for it,
// each until its own ctx ends.
func (p *Publisher) connect(ctx context.Context) (*amqpx.Confirmer, error) {
	if conf, err := p.current(); conf != nil || err != nil {
		return conf, err
	}
	release, err := amqpx.Take(ctx, p.opening, "dial")
	if err != nil {
		return nil, err
	}
	defer release()
	if conf, err := p.current(); conf != nil || err != nil { // connected while we waited
		return conf, err
	}
	conn, err := p.conns.Get(ctx)
	if errors.Is(err, amqpx.ErrConnClosed) {
		return nil, errPublisherClosed
	}
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, errPublisherClosed
	}
	if conn != p.conn { // a new connection: nothing is declared on it yet
		p.conn, p.declared = conn, map[Route]bool{}
	}
	p.mu.Unlock()
	stop := amqpx.Watch(ctx, conn)
	defer stop()
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel: %w", err)
	}
	conf, err := amqpx.NewConfirmer(ch)
	if err != nil {
		_ = ch.Close()
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = ch.Close()
		return nil, errPublisherClosed
	}
	p.conf = conf
	return conf, nil
}

// retire stops publishing on conf's channel (see amqpx.Confirmer.Retire): the next publish
// opens another one on the same connection.
func (p *Publisher) retire(conf *amqpx.Confirmer) {
	p.mu.Lock()
	if p.conf == conf {
		p.conf = nil
	}
	p.mu.Unlock()
	conf.Retire()
}

var errPublisherClosed = amqpx.GiveUp(fmt.Errorf("dlx: publisher is %w", warren.ErrClosed))

// current returns the open confirm channel, or nil if there is none; the error is set once
// the publisher is closed.
func (p *Publisher) current() (*amqpx.Confirmer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errPublisherClosed
	}
	if p.conf != nil && p.conf.Closed() == nil && p.conn != nil && !p.conn.IsClosed() {
		return p.conf, nil
	}
	return nil, nil
}

// forServer is the publisher's builder for the broker of the current connection.
func (p *Publisher) forServer() *topology.Builder {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.builder.ForServer(amqpx.ServerVersion(p.conn))
}

// Delay returns the layout of the delay levels.
func (p *Publisher) Delay() topology.Delay { return p.delay }

// Close closes the connection, waiting for the broker's answer no longer than
// amqpx.CloseTimeout (5s). Publishes in flight fail.
func (p *Publisher) Close() error {
	p.mu.Lock()
	closed := p.closed
	p.closed = true
	p.mu.Unlock()
	if closed {
		return nil
	}
	var err error
	if p.parked != nil {
		err = p.parked.Unregister()
	}
	if p.ownConn {
		err = errors.Join(p.conns.Close(), err)
	}
	return err
}
