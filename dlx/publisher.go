package dlx

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/shared"
	"github.com/warrenmq/warren/internal/telemetry"
	"github.com/warrenmq/warren/ledger"
	"github.com/warrenmq/warren/topology"
)

// Route is where a topic is published: an exchange and a routing key. The default exchange
// ("") with a queue's name as the routing key addresses that queue.
type Route struct {
	Exchange   string
	RoutingKey string
	// Declared says the destination exists already and must not be declared by the
	// publisher (a poison queue, declared with its work queue).
	Declared bool
}

// ToQueue routes topic to the work queue of the same name. It is the default.
func ToQueue(topic string) Route { return Route{RoutingKey: topic} }

// ToExchange routes every topic to exchange, with the topic as the routing key (for a topic
// exchange such as "events", publish to "order.created").
func ToExchange(exchange string) func(topic string) Route {
	return func(topic string) Route { return Route{Exchange: exchange, RoutingKey: topic} }
}

// ExchangePerTopic routes topic to the exchange of the same name with an empty routing key
// (watermill-amqp's pub/sub layout).
func ExchangePerTopic(topic string) Route { return Route{Exchange: topic} }

// Config configures a Publisher.
type Config struct {
	// Connection says how to reach the broker (URL required); its ConnectTimeout bounds
	// connecting and declaring, retries included.
	Connection warren.Connection
	// Topology configures the builder, including the layout of the delay levels.
	Topology topology.Config
	// Declare is declared when the publisher starts, after the delay levels. Destinations
	// listed here are declared as listed; others on their first publish, a queue as a work
	// queue and an exchange of kind Topology.ExchangeKind.
	Declare topology.Topology
	// Route maps a topic to its destination. Default ToQueue.
	Route func(topic string) Route
	// AllowUnroutable publishes without the mandatory flag: a message no queue takes is then
	// dropped by the broker instead of failing Publish.
	AllowUnroutable bool
	// Marshaler defaults to warren.Marshaler{}.
	Marshaler wamqp.Marshaler
	// PublishTimeout bounds one call of Publish, retries included. Default 30s.
	PublishTimeout time.Duration
	// PastTolerance is how far in the past a DeliverAt time may lie (it is then delivered
	// at once) before it is an error. Default 1s.
	PastTolerance time.Duration
	// MeterProvider records the publisher's metrics: messaging.client.sent.messages and
	// messaging.client.operation.duration per Publish call, and the gauge
	// warren.delay.parked (see the README's Metrics). Default: otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// Defaults of Config.
const (
	DefaultPublishTimeout = 30 * time.Second
	DefaultPastTolerance  = time.Second
)

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	c.Connection = c.Connection.WithDefaults()
	c.Topology = c.Topology.WithDefaults()
	if c.Route == nil {
		c.Route = ToQueue
	}
	if c.Marshaler == nil {
		c.Marshaler = warren.Marshaler{}
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = DefaultPublishTimeout
	}
	if c.PastTolerance == 0 {
		c.PastTolerance = DefaultPastTolerance
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	return c
}

// Validate reports the first field of c that is not usable. No error contains a password
// of Config.Connection.URL.
func (c Config) Validate() error {
	if err := c.Connection.Validate(); err != nil {
		return fmt.Errorf("dlx: Config.%w", err)
	}
	if err := c.Topology.Validate(); err != nil {
		return err
	}
	if err := c.Declare.ValidateWith(c.Topology); err != nil {
		return fmt.Errorf("dlx: Config.Declare: %w", err)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"PublishTimeout", c.PublishTimeout}, {"PastTolerance", c.PastTolerance}} {
		if f.d < 0 {
			return fmt.Errorf("dlx: Config.%s %s is negative", f.name, f.d)
		}
	}
	return nil
}

// Publisher is a Watermill message.Publisher for RabbitMQ that can delay messages.
//
// A message without delay metadata is published at once. A delayed one (Delay, DeliverAt,
// or Watermill's components/delay metadata) travels through the delay levels of
// topology.Delay and reaches its destination with its routing key. Publish returns nil only
// once the broker has confirmed every message; a return (no queue took the message) is an
// error at once, and a nack is published again until the time limit, then an error that
// wraps ErrNacked. Many messages are in flight on the channel at once,
// whether from one Publish call or from many goroutines.
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

func init() {
	shared.NewPublisher = func(config any, conn *amqpx.Conn, declare bool, logger watermill.LoggerAdapter) (message.Publisher, error) {
		c, ok := config.(Config)
		if !ok {
			return nil, fmt.Errorf("dlx: shared.NewPublisher: config is a %T, not a dlx.Config", config)
		}
		if err := c.Validate(); err != nil {
			return nil, err
		}
		if logger == nil {
			logger = watermill.NopLogger{}
		}
		return newPublisher(c.WithDefaults(), conn, false, declare, logger)
	}
}

// newPublisher returns a publisher of config (validated, defaulted) that publishes on conns,
// each publisher on a confirm channel of its own, and closes conns when it closes if own is
// set. With declare set it connects and declares the delay levels and Config.Declare now, and
// reports warren.delay.parked; without, it does neither (a publisher that shares the
// connection of one that did, see package shared) and connects at its first publish.
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

// list remembers t's exchanges and queues, so that a publish to one of them declares it as
// listed.
func (p *Publisher) list(t topology.Topology) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range t.Exchanges {
		p.exchanges[e.Name] = e
	}
	for _, q := range t.Queues {
		p.queues[q.Name] = q
	}
}

// Declare declares t now (retrying until Config.Connection.ConnectTimeout) and remembers its
// exchanges and queues, so that publishing to one of them never declares it otherwise.
// The delay levels were declared when the publisher started.
func (p *Publisher) Declare(ctx context.Context, t topology.Topology) error {
	return p.declareWith(ctx, t, (*topology.Builder).DeclareTopology)
}

// declareWith declares t with declare, a method of the publisher's builder for the broker's
// version (see topology.Builder.ForServer).
func (p *Publisher) declareWith(ctx context.Context, t topology.Topology,
	declare func(*topology.Builder, context.Context, *amqp.Channel, topology.Topology) error) error {
	if err := t.Validate(); err != nil {
		return err
	}
	p.list(t)
	return amqpx.RetryLogged(ctx, p.cfg.Connection.ConnectTimeout, "dlx: declare", p.logger, nil, func(ctx context.Context) error {
		if _, err := p.connect(ctx); err != nil {
			return err
		}
		return p.withDeclareChannel(ctx, func(ch *amqp.Channel) error { return declare(p.forServer(), ctx, ch, t) })
	})
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

// withDeclareChannel runs fn on a channel of its own, so that a failed declaration never
// closes the channel that messages are in flight on.
func (p *Publisher) withDeclareChannel(ctx context.Context, fn func(ch *amqp.Channel) error) error {
	p.mu.Lock()
	conn := p.conn
	p.mu.Unlock()
	if conn == nil {
		return errors.New("not connected")
	}
	stop := amqpx.Watch(ctx, conn)
	defer stop()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer ch.Close()
	return amqpx.GiveUpIfRefused(fn(ch))
}

// declare declares route's destination once per connection: nothing published before the
// first consumer subscribes is lost, and a delayed message can reach it.
func (p *Publisher) declare(ctx context.Context, route Route) error {
	if route.Declared {
		return nil
	}
	if route.Exchange != "" {
		route.RoutingKey = "" // the exchange is the destination, whatever the key
	}
	done := func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.declared[route]
	}
	if done() {
		return nil
	}
	release, err := amqpx.Take(ctx, p.declaring, "declaration")
	if err != nil {
		return err
	}
	defer release()
	if done() { // declared by a call that declared before
		return nil
	}
	p.mu.Lock()
	q, e := p.queues[route.RoutingKey], p.exchanges[route.Exchange]
	p.mu.Unlock()
	err = p.withDeclareChannel(ctx, func(ch *amqp.Channel) error {
		if route.Exchange == "" {
			q.Name = route.RoutingKey
			return p.forServer().DeclareQueue(ctx, ch, q)
		}
		e.Name = route.Exchange
		return p.forServer().DeclareExchange(ctx, ch, e)
	})
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.declared[route] = true
	p.mu.Unlock()
	return nil
}

type outgoing struct {
	pub       amqp.Publishing
	due       time.Time // zero: at once
	confirmed bool      // by the broker
	suspect   bool      // in flight when a broker refusal closed the channel
}

// Publish publishes msgs to topic's destination and returns once the broker has confirmed
// all of them. Transient failures (a lost connection) are retried until
// Config.PublishTimeout; a message may then reach the broker twice, never zero times
// without an error. Publish returns early, with that context's error, when the context of
// one of msgs ends. An error that publishing again cannot cure (see warren.PermanentError)
// is marked warren.Permanent.
func (p *Publisher) Publish(topic string, msgs ...*message.Message) error {
	err := p.publish(topic, msgs)
	if err != nil && isPermanent(err) {
		return warren.Permanent(err)
	}
	return err
}

func (p *Publisher) publish(topic string, msgs []*message.Message) error {
	route := p.cfg.Route(topic)
	now := time.Now()
	out := make([]outgoing, len(msgs))
	var records []outgoing // to the ledger, before the messages
	for i, msg := range msgs {
		at, err := due(msg, now, p.cfg.PastTolerance)
		var plan topology.Plan
		if err == nil && !at.IsZero() {
			plan, err = p.delay.Plan(max(at.Sub(now), 0)) // reject what can never be planned
		}
		if err != nil {
			return fmt.Errorf("dlx: publish message %s to %q: %w: %w", msg.UUID, topic, ErrInvalidDelay, err)
		}
		pub, err := p.cfg.Marshaler.Marshal(msg)
		if err != nil {
			return fmt.Errorf("dlx: marshal message %s: %w", msg.UUID, err)
		}
		for k := range pub.Headers {
			if !sentMetadata(k) {
				delete(pub.Headers, k)
			}
		}
		if pub.Headers == nil {
			pub.Headers = amqp.Table{}
		}
		id := msg.Metadata.Get(warren.MetadataPublishID)
		if id == "" {
			id = publishID()
		}
		pub.Headers[warren.PublishIDHeader] = id
		if err := fits(pub, plan, route); err != nil {
			return fmt.Errorf("dlx: publish message %s to %q: %w", msg.UUID, topic, err)
		}
		out[i] = outgoing{pub: pub, due: at}
		if sid := msg.Metadata.Get(warren.MetadataScheduleID); sid != "" && plan.Exchange != "" {
			records = append(records, p.scheduledRecord(sid, route, at, now))
		}
	}

	ctx, cancel := messagesContext(msgs)
	defer cancel()
	start := time.Now()
	err := amqpx.RetryLogged(ctx, p.cfg.PublishTimeout, "", p.logger, func() string { return "dlx: publish to " + topic }, func(ctx context.Context) error {
		conf, err := p.connect(ctx)
		if err != nil {
			return err
		}
		if err := p.declare(ctx, route); err != nil {
			return err
		}
		if len(records) > 0 {
			if err := p.declareLedger(ctx); err != nil {
				return err
			}
			if err := p.publishAll(ctx, conf, p.ledgerRoute(), records); err != nil {
				return err
			}
		}
		for i := range out {
			if out[i].suspect && !out[i].confirmed {
				if err := p.publishAlone(ctx, route, out[i]); err != nil {
					return err
				}
				out[i].confirmed = true
			}
		}
		return p.publishAll(ctx, conf, route, out)
	})
	sent := 0
	for _, o := range out {
		if o.confirmed {
			sent++
		}
	}
	if len(out) > 0 {
		p.metrics.Published(ctx, p.publishAttrs(route), start, sent, len(out)-sent, err)
	}
	if err != nil {
		return fmt.Errorf("dlx: publish to %q: %w", topic, err) // formatted only on failure
	}
	return nil
}

// Schedule makes msg, delayed with Delay or DeliverAt, listable and cancellable under id
// (msg.UUID when id is ""), and returns the id: Publish records it in the ledger of the
// delay levels before it publishes the message, and ledger.Ledger lists and cancels it (see
// package ledger). A message published without a delay is not recorded.
func Schedule(msg *message.Message, id string) string {
	if id == "" {
		id = msg.UUID
	}
	msg.Metadata.Set(warren.MetadataScheduleID, id)
	return id
}

// scheduledRecord is the ledger record of the message scheduled under id to route, due at
// due, published now.
func (p *Publisher) scheduledRecord(id string, route Route, due, now time.Time) outgoing {
	e := ledger.Entry{ID: id, Exchange: route.Exchange, RoutingKey: route.RoutingKey, Due: due.UTC(), Scheduled: now.UTC()}
	if route.Exchange == "" {
		e.Queue, e.RoutingKey = route.RoutingKey, ""
	}
	return outgoing{pub: amqp.Publishing{ContentType: "application/json", DeliveryMode: amqp.Persistent, Body: ledger.ScheduledRecord(e)}}
}

// ledgerRoute is where ledger records go: the stream, through the default exchange.
func (p *Publisher) ledgerRoute() Route {
	return Route{RoutingKey: p.delay.LedgerQueue(), Declared: true}
}

// declareLedger declares the ledger stream, once per connection.
func (p *Publisher) declareLedger(ctx context.Context) error {
	key := Route{RoutingKey: p.delay.LedgerQueue()}
	p.mu.Lock()
	done := p.declared[key]
	p.mu.Unlock()
	if done {
		return nil
	}
	err := p.withDeclareChannel(ctx, func(ch *amqp.Channel) error {
		return amqpx.Do(ctx, ch, func() error { return topology.DeclareLedger(ch, p.delay) })
	})
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.declared[key] = true
	p.mu.Unlock()
	return nil
}

// destination is what the metrics of a publish are recorded by: the exchange, and the queue
// for a publish to the default exchange.
type destination struct{ exchange, queue string }

// publishAttrs returns the attribute sets of the metrics of a publish to route.
func (p *Publisher) publishAttrs(route Route) *telemetry.Publish {
	d := destination{exchange: route.Exchange}
	if d.exchange == "" {
		d.queue = route.RoutingKey
	}
	p.attrsMu.RLock()
	a := p.attrs[d]
	p.attrsMu.RUnlock()
	if a != nil {
		return a
	}
	a = telemetry.NewPublish(d.exchange, d.queue)
	p.attrsMu.Lock()
	p.attrs[d] = a
	p.attrsMu.Unlock()
	return a
}

// publishID returns a new id for warren.PublishIDHeader: 64 random bits, in hex.
func publishID() string {
	return strconv.FormatUint(rand.Uint64(), 16)
}

// fits checks that pub, with the delay plan's headers and the destination header that
// publishAll adds, is within amqpx.MaxHeaderFrame.
func fits(pub amqp.Publishing, plan topology.Plan, route Route) error {
	size, err := amqpx.HeaderFrameSize(pub)
	if err != nil {
		return err
	}
	if plan.Exchange != "" {
		extra := amqp.Table{warren.DestQueueHeader: route.RoutingKey, warren.DestExchangeHeader: route.Exchange,
			warren.DueHeader: int64(0)}
		moved := amqp.Publishing{Headers: amqp.Table{}, Expiration: pub.Expiration, Priority: pub.Priority}
		levelSafe(&moved)
		for k, v := range moved.Headers {
			extra[k] = v
		}
		for k, v := range plan.Headers {
			extra[k] = v
		}
		n, _ := amqpx.HeaderFrameSize(amqp.Publishing{Headers: extra})
		size += n
	}
	if size > amqpx.MaxHeaderFrame {
		return fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, size, amqpx.MaxHeaderFrame)
	}
	return nil
}

// messagesContext returns a context that ends when the context of any of msgs ends.
func messagesContext(msgs []*message.Message) (context.Context, context.CancelFunc) {
	if !slices.ContainsFunc(msgs, func(m *message.Message) bool { return m.Context().Done() != nil }) {
		return context.Background(), func() {} // none can end (the usual case): nothing to watch
	}
	if len(msgs) == 1 { // a handler's output or reply: its own context, with nothing to watch
		return msgs[0].Context(), func() {}
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	var stops []func() bool
	watched := map[<-chan struct{}]bool{} // messages of one caller share a context: watched once
	for _, msg := range msgs {
		mctx := msg.Context()
		if mctx.Err() != nil {
			cancel(context.Cause(mctx))
		} else if done := mctx.Done(); done != nil && !watched[done] {
			watched[done] = true
			stops = append(stops, context.AfterFunc(mctx, func() { cancel(context.Cause(mctx)) }))
		}
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel(nil)
	}
}

// publishAll sends every message not yet confirmed, then waits for all of them. A return is
// final; a nack and a closed channel are retried by the caller. A broker refusal that closes
// the channel (access refused, a message size over the broker's limit) cannot be told apart
// from the messages in flight with it: those are marked suspect and sent alone next time.
func (p *Publisher) publishAll(ctx context.Context, conf *amqpx.Confirmer, route Route, out []outgoing) error {
	type sent struct {
		i int
		f *amqpx.Inflight
	}
	flights := make([]sent, 0, len(out))
	var sendErr error
	for i, o := range out {
		if o.confirmed {
			continue
		}
		exchange, key, pub, err := p.prepare(route, o)
		if err != nil {
			sendErr = amqpx.GiveUp(err)
			break
		}
		f, err := conf.Publish(ctx, exchange, key, !p.cfg.AllowUnroutable, pub)
		if err != nil {
			out[i].suspect = amqpx.IsPermanentBrokerError(err)
			sendErr = err
			break
		}
		flights = append(flights, sent{i, f})
	}
	var final error
	for _, s := range flights {
		err := s.f.Wait(ctx)
		var ret *ReturnedError
		switch {
		case err == nil:
			out[s.i].confirmed = true
		case errors.As(err, &ret):
			if final == nil {
				final = amqpx.GiveUp(fmt.Errorf("message %s: %w", out[s.i].pub.MessageId, err))
			}
		case errors.Is(err, ErrNacked):
			// Published again after a backoff, until the time limit, on a fresh channel: the
			// broker did not take it (a full queue that rejects publishes, a quorum queue
			// without a leader for a moment), and RabbitMQ 3.10 goes on nacking on a channel
			// that published while the queue had no leader.
			p.retire(conf)
			if sendErr == nil {
				sendErr = fmt.Errorf("message %s: %w (%s)", out[s.i].pub.MessageId, err, nackHint(route))
			}
		default:
			out[s.i].suspect = amqpx.IsPermanentBrokerError(err)
			if sendErr == nil {
				sendErr = err
			}
		}
	}
	if final != nil {
		return final
	}
	return sendErr
}

// nackHint says what a nack of a publish to route can mean: basic.nack carries no reason.
func nackHint(route Route) string {
	to := fmt.Sprintf("exchange %q, routing key %q", route.Exchange, route.RoutingKey)
	if route.Exchange == "" {
		to = fmt.Sprintf("queue %q", route.RoutingKey)
	}
	return "a nack gives no reason: a queue it was routed to (" + to + ", or a delay level) took none; it may be " +
		"down (a quorum queue without a leader; see `warren status --management`) or full and rejecting publishes"
}

// prepare returns where o is published now, and how: to its destination, or with the
// digits of its remaining delay to the delay levels.
func (p *Publisher) prepare(route Route, o outgoing) (exchange, key string, pub amqp.Publishing, err error) {
	exchange, key, pub = route.Exchange, route.RoutingKey, o.pub
	if o.due.IsZero() {
		return exchange, key, pub, nil
	}
	plan, err := p.delay.Plan(max(time.Until(o.due), 0))
	if err != nil || plan.Exchange == "" {
		return exchange, key, pub, err
	}
	pub.Headers = make(amqp.Table, len(o.pub.Headers)+len(plan.Headers)+2)
	for k, v := range o.pub.Headers {
		pub.Headers[k] = v
	}
	for k, v := range plan.Headers {
		pub.Headers[k] = v
	}
	pub.Headers[warren.DueHeader] = o.due.UnixMicro() // for the consumer's warren.delay.lateness
	levelSafe(&pub)
	if route.Exchange == "" {
		pub.Headers[warren.DestQueueHeader] = route.RoutingKey
	} else {
		pub.Headers[warren.DestExchangeHeader] = route.Exchange
	}
	return plan.Exchange, key, pub, nil
}

// levelSafe moves the properties that would break the delay levels into headers of their
// metadata keys, which warren.Marshaler reads back: the expiration (a per-message TTL would cut
// the wait in a level queue short; the broker removes it on dead-lettering anyway) and the
// priority (quorum queues of RabbitMQ 4.0 take high-priority messages first, and a level
// queue then expires the messages behind one only with it: a priority 0 message that entered
// a 2 s level 1 s before a priority 9 one came out with it, 1 s late, measured on 4.0.5;
// 3.10.8, whose quorum queues have no priorities, was on time).
// The destination therefore gets a delayed message without these properties, and its
// metadata with them.
func levelSafe(pub *amqp.Publishing) {
	if pub.Expiration != "" {
		pub.Headers[warren.MetadataExpiration] = pub.Expiration
		pub.Expiration = ""
	}
	if pub.Priority != 0 {
		pub.Headers[warren.MetadataPriority] = strconv.Itoa(int(pub.Priority))
		pub.Priority = 0
	}
}

// publishAlone publishes o on a confirm channel of its own, so that a broker refusal that
// closes the channel is this message's own: it is then a permanent error.
func (p *Publisher) publishAlone(ctx context.Context, route Route, o outgoing) error {
	exchange, key, pub, err := p.prepare(route, o)
	if err != nil {
		return amqpx.GiveUp(err)
	}
	return p.withDeclareChannel(ctx, func(ch *amqp.Channel) error {
		conf, err := amqpx.NewConfirmer(ch)
		if err != nil {
			return err
		}
		f, err := conf.Publish(ctx, exchange, key, !p.cfg.AllowUnroutable, pub)
		if err == nil {
			err = f.Wait(ctx)
		}
		if isPermanent(err) {
			return amqpx.GiveUp(fmt.Errorf("message %s: %w", pub.MessageId, err))
		}
		return err
	})
}

// Parked returns how many delayed messages wait in the parking queue because their
// destination did not exist when they arrived. The queue's name is
// topology.Delay.ParkingQueue(); its messages keep their headers, including the
// destination (warren.DestExchangeHeader or warren.DestQueueHeader).
func (p *Publisher) Parked(ctx context.Context) (int, error) {
	var n int
	err := amqpx.RetryLogged(ctx, p.cfg.Connection.ConnectTimeout, "dlx: count parked messages", p.logger, nil, func(ctx context.Context) error {
		if _, err := p.connect(ctx); err != nil {
			return err
		}
		var err error
		n, err = p.inspectParked(ctx)
		return err
	})
	return n, err
}

// inspectParked counts the messages in the parking queue, on the current connection.
func (p *Publisher) inspectParked(ctx context.Context) (n int, err error) {
	err = p.withDeclareChannel(ctx, func(ch *amqp.Channel) error {
		return amqpx.Do(ctx, ch, func() error {
			q, err := ch.QueueDeclarePassive(p.delay.ParkingQueue(), true, false, false, false, nil)
			n = q.Messages
			return err
		})
	})
	return n, err
}

// parkedTimeout bounds the count of parked messages at a metrics collection.
const parkedTimeout = 2 * time.Second

// countParked is the callback of the warren.delay.parked gauge: the count of the parking
// queue, on the connection the publisher has (it never dials for it), within parkedTimeout;
// ok is false when there is none or the count failed.
func (p *Publisher) countParked(ctx context.Context) (n int64, ok bool) {
	if conf, _ := p.current(); conf == nil {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(ctx, parkedTimeout)
	defer cancel()
	c, err := p.inspectParked(ctx)
	return int64(c), err == nil
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
