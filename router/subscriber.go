package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/telemetry"
	"github.com/warrenmq/warren/topology"
)

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// Connection says how to reach the broker (URL required); its ConnectTimeout bounds
	// connecting and declaring in Subscribe.
	Connection warren.Connection
	// Topology configures the builder that declares the queues subscribed to.
	Topology topology.Config
	// Queues lists queues with options of their own (type, delivery limit); any other
	// queue subscribed to is declared as a work queue with the defaults.
	Queues []topology.Queue
	// Concurrency is how many messages of one subscription are handed out at once: Watermill's
	// router processes each in a goroutine of its own. Default 64.
	Concurrency int
	// Prefetch is how many messages the broker sends ahead of their acks (basic.qos), at least
	// Concurrency: the ones not handed out yet wait in the subscriber, and go back to the
	// queue when it stops. A quorum queue delivers faster with more outstanding. Default
	// 4×Concurrency, at most 65535. Messages are handed out in order only with Concurrency 1
	// and Prefetch 1 (a nacked message goes back behind those prefetched).
	Prefetch int
	// ShutdownTimeout bounds how long closing waits for the messages handed out to be
	// acked. Default 30s.
	ShutdownTimeout time.Duration
	// Marshaler defaults to warren.Marshaler{}. A delivery it cannot unmarshal goes to the
	// poison queue with the reason.
	Marshaler wamqp.Marshaler
	// HandlerName is recorded in the poison headers of deliveries that cannot be
	// unmarshaled, and in kill events.
	HandlerName string
	// KillSecret, when set, makes the subscriber obey only kill commands signed with it
	// (see kill.Killer); others are refused and logged.
	KillSecret []byte
	// KillMaxAge bounds the age of a kill command received, against replays. Default 1m.
	KillMaxAge time.Duration
	// KillClockSkew is how far ahead of this clock a kill command may be dated; one dated
	// further ahead is refused. Default 5s.
	KillClockSkew time.Duration
	// OnKill, when set, is told what each subscription does about the kill topic.
	OnKill func(KillEvent)
	// RequeueDelay is how long a message that is nacked (a handler error that is not retried
	// or poisoned, e.g. its retry could not be published) waits before it goes back to the
	// queue, so that nothing is redelivered in a hot loop. Not when the subscriber closes.
	// Default 1s.
	RequeueDelay time.Duration
	// MeterProvider records the subscriber's metrics: messaging.client.consumed.messages,
	// warren.delay.lateness, warren.kill.events, and warren.messages.poisoned for the
	// deliveries it poisons itself (see the README's Metrics). Default:
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// WithDefaults returns c with every unset field set to its default.
func (c SubscriberConfig) WithDefaults() SubscriberConfig {
	c.Connection = c.Connection.WithDefaults()
	c.Topology = c.Topology.WithDefaults()
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Prefetch == 0 {
		c.Prefetch = min(DefaultPrefetchPerHandler*c.Concurrency, 65535)
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.Marshaler == nil {
		c.Marshaler = warren.Marshaler{}
	}
	if c.KillMaxAge == 0 {
		c.KillMaxAge = DefaultKillMaxAge
	}
	if c.RequeueDelay == 0 {
		c.RequeueDelay = DefaultRequeueDelay
	}
	if c.KillClockSkew == 0 {
		c.KillClockSkew = DefaultKillClockSkew
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	return c
}

// Defaults of SubscriberConfig.
const (
	DefaultConcurrency = 64
	// DefaultPrefetchPerHandler times Concurrency is the default Prefetch (at most 65535).
	DefaultPrefetchPerHandler = 4
	DefaultShutdownTimeout    = 30 * time.Second
	DefaultKillMaxAge         = time.Minute
	DefaultKillClockSkew      = 5 * time.Second
	DefaultRequeueDelay       = time.Second
)

// Validate reports the first field of c that is not usable. No error contains a password
// of SubscriberConfig.Connection.URL.
func (c SubscriberConfig) Validate() error {
	if err := c.Connection.Validate(); err != nil {
		return fmt.Errorf("router: SubscriberConfig.%w", err)
	}
	if err := c.validate(); err != nil {
		return fmt.Errorf("router: SubscriberConfig.%w", err)
	}
	if err := c.Topology.Validate(); err != nil {
		return err
	}
	return topology.Topology{Queues: c.Queues}.ValidateWith(c.Topology)
}

// validate checks the fields of c that a router's Config has too, naming each bare
// ("Concurrency ..."), for the caller to say whose it is.
func (c SubscriberConfig) validate() error {
	if c.Concurrency < 0 || c.Concurrency > 65535 {
		return fmt.Errorf("%s %d is outside 1..65535", "Concurrency", c.Concurrency)
	}
	if c.Prefetch < 0 || c.Prefetch > 65535 || c.Prefetch > 0 && c.Prefetch < c.WithDefaults().Concurrency {
		return fmt.Errorf("%s %d is outside Concurrency..65535", "Prefetch", c.Prefetch)
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"ShutdownTimeout", c.ShutdownTimeout}, {"KillMaxAge", c.KillMaxAge},
		{"KillClockSkew", c.KillClockSkew}, {"RequeueDelay", c.RequeueDelay}} {
		if f.d < 0 {
			return fmt.Errorf("%s %s is negative", f.name, f.d)
		}
	}
	return nil
}

// Subscriber is a Watermill message.Subscriber for RabbitMQ work queues. Unlike
// watermill-amqp's, it hands out up to Concurrency messages at once, so a Watermill router
// processes them concurrently; it closes gracefully; and it keeps consuming after the broker
// drops its connection. The topic of Subscribe is the name of the queue to consume. Its
// subscriptions share one connection, each on channels of its own (a Router's handlers share
// the router's: see the package doc).
//
// Closing (or cancelling Subscribe's context) stops taking messages: the consumer is
// cancelled, the messages handed out are waited for, up to ShutdownTimeout, to be acked or
// nacked, their settlements go out together, and the channel closes, which returns what was
// received but not handed out to the queue. Nothing is lost, and a handler that finishes in
// time never sees its message again.
//
// A queue deleted under a consumer stops that subscription (its channel of messages is
// closed, and Err reports it): the queue is not declared again and no empty message is
// handed out. A consumer cancelled by the broker while its queue still exists (a classic
// queue's node went down; RabbitMQ 4.3 cancels a quorum queue's consumer that held a message
// past its consumer timeout) is not a deletion: the messages in flight finish and are
// settled on the consumer's channel, which stays open (up to ShutdownTimeout), and the
// subscription consumes again, with backoff. A channel the broker closes (before 4.3, a
// consumer past its consumer timeout) takes every message unacked on it back to the queue:
// the subscription consumes again, and the broker delivers them again.
//
// A copy of a message this subscriber acked in the last minutes (same warren.PublishIDHeader:
// a publisher's re-send after a lost confirm, a redelivery after a lost ack) is acked at once
// and not handed out again. Copies that reach different processes are recognised only by a
// store the processes share: see Config.CopyStore.
//
// A message is handed out with warren.Delivery and warren.DeadLetter in its context. warren's
// bookkeeping headers (see warren.IsBookkeeping) are believed only where warren put them:
// the attempt bookkeeping (warren.IsAttemptBookkeeping) only on a retry of this queue,
// that is a message that came straight to the queue through the default exchange, or through
// the delay levels addressed to the queue, and whose warren.RetryQueueKey names the queue
// (Backoff sets it on every retry); the poison record only on a message that came straight to
// the queue (a poison queue's consumer reads it). On any other message they are dropped, so
// that a copy forwarded from another queue (by any publisher), or a foreign or forged attempt
// count or poison header, starts at attempt 1. watermill-amqp's redelivered flag is set from
// the delivery, never taken from a header. A delivery whose headers the client could not
// read (see amqpx.GuardConn), or that the Marshaler cannot unmarshal, goes to the poison
// queue with the reason; if even that cannot be published (too large), it is rejected into
// the queue's dead-letter path.
//
// Every subscription listens to its queue's kill topic (see kill.Killer) on an exclusive queue of
// its own: a stop command pauses it (it stops as on closing, but keeps listening), a resume
// lifts that, and a delete command makes it consume until the queue is empty and then delete
// the queue and end. The last command sent is remembered by the broker (in the queue's kill
// state queue, see kill.StateQueue), so a subscription that starts after a kill does not
// consume until a resume, and refuses a replay of a command older than the last one. A live
// command that carries a reply address is answered (see kill.Answer), fire and forget; one read
// from the state never is.
type Subscriber struct {
	cfg     SubscriberConfig
	logger  watermill.LoggerAdapter
	builder *topology.Builder
	conns   *consumerConns // its own, or its router's
	ownConn bool           // Close closes conns
	listed  map[string]topology.Queue
	// viaDelay starts the name of every delay level exchange: a delivery from one came
	// through the delay levels.
	viaDelay string

	mu     sync.Mutex
	closed bool

	closing  chan struct{} // closed by Close
	hardStop context.Context
	hardFn   context.CancelCauseFunc
	subs     sync.WaitGroup

	goneMu sync.Mutex
	gone   []error // subscriptions ended because their queue was deleted

	readyMu sync.Mutex
	readies []chan struct{} // one per subscription, closed by its ready

	seen seenIDs // publish ids of the deliveries acked lately

	metrics   *telemetry.Instruments
	consumes  telemetry.Consumes // attribute sets of messaging.client.consumed.messages
	answering sync.WaitGroup     // answers to kill commands being published
}

// errSubscriberClosed is the error of a call on a closed Subscriber: permanent, so that no
// retry waits for the time limit.
var errSubscriberClosed = amqpx.GiveUp(fmt.Errorf("router: subscriber is %w", warren.ErrClosed))

// errShutdownTimeout ends the context of the messages still in flight when ShutdownTimeout
// has passed.
var errShutdownTimeout = errors.New("shutdown timeout: the message goes back to its queue")

var _ message.Subscriber = (*Subscriber)(nil)

// NewSubscriber returns a Subscriber; it connects on the first Subscribe. Its subscriptions
// share a connection of its own (see consumerConns), which Close closes.
func NewSubscriber(config SubscriberConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	return newSubscriber(config, logger, nil)
}

// newSubscriber is NewSubscriber on conns, which the Subscriber does not close, or, when
// conns is nil, on connections of its own.
func newSubscriber(config SubscriberConfig, logger watermill.LoggerAdapter, conns *consumerConns) (*Subscriber, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config = config.WithDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	own := conns == nil
	if own {
		conns = newConsumerConns(config.Connection, "warren subscriber "+config.HandlerName, nil, logger)
	}
	builder, err := topology.NewBuilder(config.Topology, logger)
	if err != nil {
		return nil, err
	}
	metrics, err := telemetry.New(config.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	s := &Subscriber{
		cfg: config, logger: logger, builder: builder, metrics: metrics, conns: conns, ownConn: own,
		listed:  map[string]topology.Queue{},
		closing: make(chan struct{}),
	}
	for _, q := range config.Queues {
		s.listed[q.Name] = q
	}
	s.viaDelay = builder.Delay().Name() + "."
	// The parent of every consume session's context (see channelState): not cancelled by
	// closing, so that handlers in flight can finish, but once every subscription stopped.
	s.hardStop, s.hardFn = context.WithCancelCause(context.Background())
	return s, nil
}

// queue returns the queue called name as declared: listed in SubscriberConfig.Queues, or a
// work queue with the defaults.
func (s *Subscriber) queue(name string) topology.Queue {
	q := s.listed[name]
	q.Name = name
	return q
}

// consumerConns are the connections that subscriptions consume on: a router's, which all its
// handlers' Subscribers share, or a Subscriber's own. Each subscription consumes on main, on a
// channel of its own, and listens to its kill topic and reads its kill state on channels of
// main too; a failure of its channel (a deleted queue, a consumer cancelled, a refusal that
// closes the channel) is its own, and the others go on.
//
// A refusal that closes the whole connection is not: RabbitMQ answers basic.consume on a
// quorum queue that is down with 541 INTERNAL_ERROR, a connection error. The subscription
// whose consume was refused so moves to isolated, a connection that only such subscriptions
// use (dialed when the first one needs it), and consumes there, so that its retries, once a
// second, never cut the other subscriptions' deliveries short; once it has consumed there, its
// next session (after that connection or its channel is lost) is on main again. To tell whose
// consume the refusal was, consumes on one connection are made one at a time (consuming).
type consumerConns struct {
	main, isolated *consumeConn
	// publish is where subscriptions publish what they publish themselves (the poison copy
	// of an undecodable delivery, answers to kill commands): the router's publishing
	// connection, or main for a Subscriber of its own.
	publish *amqpx.Conn
}

// consumeConn is a connection that subscriptions consume on.
type consumeConn struct {
	*amqpx.Conn
	consuming sync.Mutex // held around basic.consume, see consumerConns
}

// newConsumerConns returns the connections of name (main; isolated, dialed when needed, is
// name + " (isolated)"), which publish on publish, or on main when publish is nil. The
// subscriptions log a lost connection, once per retry: the Dialers log it at Debug only.
func newConsumerConns(c warren.Connection, name string, publish *amqpx.Conn, logger watermill.LoggerAdapter) *consumerConns {
	cc := &consumerConns{
		main:     &consumeConn{Conn: amqpx.NewConn(amqpx.NewDialer(c, name, logger).OwnerReportsLoss())},
		isolated: &consumeConn{Conn: amqpx.NewConn(amqpx.NewDialer(c, name+" (isolated)", logger).OwnerReportsLoss())},
		publish:  publish,
	}
	if cc.publish == nil {
		cc.publish = cc.main.Conn
	}
	return cc
}

// close closes the consuming connections (not publish, unless it is main).
func (cc *consumerConns) close() error {
	return errors.Join(cc.main.Close(), cc.isolated.Close())
}

// connection returns the open main consuming connection, dialling when there is none (see
// connectionOn).
func (s *Subscriber) connection(ctx context.Context) (*amqp.Connection, error) {
	return s.connectionOn(ctx, s.conns.main.Conn)
}

// connectionOn returns c's open connection, dialling when there is none: one call at a time
// dials, without holding s.mu (Close is never held up by a dial); the others wait for it, each
// until its own ctx ends. A dial and the wait for it are bounded by ctx and ConnectTimeout.
func (s *Subscriber) connectionOn(ctx context.Context, c *amqpx.Conn) (*amqp.Connection, error) {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return nil, errSubscriberClosed
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Connection.ConnectTimeout)
	defer cancel()
	conn, err := c.Get(ctx)
	if errors.Is(err, amqpx.ErrConnClosed) {
		return nil, errSubscriberClosed
	}
	return conn, err
}

// Subscribe declares queue (a work queue, with its poison queue) and consumes it until ctx
// ends or the subscriber is closed.
func (s *Subscriber) Subscribe(ctx context.Context, queue string) (<-chan *message.Message, error) {
	if err := s.SubscribeInitialize(queue); err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	sub := &subscription{s: s, queue: queue, out: out, ready: make(chan struct{}), lateness: telemetry.QueueOptions(queue),
		id: self().id + "-" + strconv.FormatUint(subscriptionSeq.Add(1), 10)}
	s.readyMu.Lock()
	s.readies = append(s.readies, sub.ready)
	s.readyMu.Unlock()
	s.subs.Add(1)
	go sub.run(ctx)
	return out, nil
}

// Ready returns a channel that is closed once every subscription made so far listens to its
// queue's kill topic and consumes (or is paused by a kill command), or has ended. Subscribe
// returns before that: a message published meanwhile waits in the queue, and a kill command
// sent meanwhile is found in the kill state when the subscription starts (see kill.Killer).
func (s *Subscriber) Ready() <-chan struct{} {
	s.readyMu.Lock()
	readies := slices.Clone(s.readies)
	s.readyMu.Unlock()
	all := make(chan struct{})
	go func() {
		for _, r := range readies {
			<-r
		}
		close(all)
	}()
	return all
}

// SubscribeInitialize declares queue without consuming it.
func (s *Subscriber) SubscribeInitialize(queue string) error {
	return amqpx.RetryLogged(context.Background(), s.cfg.Connection.ConnectTimeout, "router: declare "+queue, s.logger, nil, func(ctx context.Context) error {
		conn, err := s.connection(ctx)
		if err != nil {
			return err
		}
		stop := amqpx.Watch(ctx, conn)
		defer stop()
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		defer ch.Close()
		// What the queue's arguments may be depends on the broker's version (see
		// topology.Topology.ValidateFor).
		b := s.builder.ForServer(amqpx.ServerVersion(conn))
		return amqpx.GiveUpIfRefused(b.DeclareQueue(ctx, ch, s.queue(queue)))
	})
}

// Close stops every subscription as described on Subscriber, then closes its connections (a
// router's Subscriber leaves them to the router).
func (s *Subscriber) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	s.mu.Unlock()

	s.subs.Wait()
	s.hardFn(errShutdownTimeout)
	var err error
	if s.ownConn {
		err = s.conns.close()
	}
	s.answering.Wait() // bounded by replyTimeout; on a Subscriber's own connection, closed: at once
	return err
}

// seenIDs remembers, for seenFor at least, the publish ids (warren.PublishIDHeader) of the
// deliveries a subscriber acked, that is handled for good (processed, retried or poisoned).
// Two generations of a map: one lookup, no per-entry timers.
type seenIDs struct {
	mu        sync.Mutex
	cur, prev map[string]struct{}
	since     time.Time // cur's start
}

const (
	seenFor = 5 * time.Minute
	seenMax = 100_000 // ids per generation: a generation ends earlier when it is full
)

func (s *seenIDs) add(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil || time.Since(s.since) > seenFor || len(s.cur) >= seenMax {
		s.prev, s.cur, s.since = s.cur, make(map[string]struct{}), time.Now()
	}
	s.cur[id] = struct{}{}
}

func (s *seenIDs) has(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, inCur := s.cur[id]
	_, inPrev := s.prev[id]
	return inCur || inPrev
}

// copies recognises, on one consume channel, the copies of a message (the same publish id: a
// publisher's re-send after a lost confirm, a redelivery after a lost ack, a retry or output
// of such a copy): one the subscriber acked lately, or one being handled on this channel. A
// copy is then acked at once instead of being handled again. The twin being handled on the
// same channel is unacked, so it is settled or delivered again: nothing is lost. (Not so on
// another channel: a channel that closed cannot settle its deliveries, and the message
// redelivered is the twin itself.)
type copies struct {
	seen *seenIDs
	mu   sync.Mutex
	live map[string]int // ids being handled on this channel
}

// claim reports whether the delivery with publish id is to be handled, and counts it as
// being handled. A delivery without one (not published by warren) always is.
func (c *copies) claim(id string) bool {
	if id == "" {
		return true
	}
	if c.seen.has(id) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live[id] > 0 {
		return false
	}
	c.live[id]++
	return true
}

// release ends the handling of a claimed id, remembering it when it was acked.
func (c *copies) release(id string, acked bool) {
	if id == "" {
		return
	}
	c.mu.Lock()
	if c.live[id]--; c.live[id] <= 0 {
		delete(c.live, id)
	}
	c.mu.Unlock()
	if acked {
		c.seen.add(id)
	}
}

// Err reports the subscriptions that ended for good, naming each queue: their queue was
// deleted (not by a kill command's delete), or the broker refused them for good (access
// refused); nil if none did.
func (s *Subscriber) Err() error {
	s.goneMu.Lock()
	defer s.goneMu.Unlock()
	return errors.Join(s.gone...)
}

type subscription struct {
	s         *Subscriber
	queue     string
	out       chan *message.Message
	ready     chan struct{} // closed once it listens and consumes (or is paused), or has ended
	readyOnce sync.Once
	id        string // in answers to kill commands (kill.Answer.Instance)
	steady    bool   // the session consumed (or listened, paused by a kill)
	// isolated makes the next session consume on consumerConns.isolated: a consume of this
	// subscription closed the main connection.
	isolated   bool
	onIsolated bool // the session is on consumerConns.isolated

	// Set by the kill topic; they outlive a lost connection.
	mode mode
	last time.Time // of the newest command accepted

	lateness []metric.RecordOption // the attributes of warren.delay.lateness
}

// mode is what a subscription does about its queue.
type mode int

const (
	running  mode = iota
	paused        // killed: consumes nothing until resumed
	draining      // consumes until the queue is empty, then deletes it
)

// outcome is why consume returned without an error.
type outcome int

const (
	closed  outcome = iota // the context ended or the subscriber closed
	killed                 // a stop command: the subscription is paused
	drained                // the queue was empty and the consumer is cancelled
)

// errQueueGone ends a subscription whose queue was deleted.
var errQueueGone = errors.New("the queue was deleted")

// errRefused ends a subscription whose consume the broker refuses for good (access refused).
// Only the consume's own refusal: amqp091-go reports a connection cut during its handshake
// (a broker restarting) as a 403 too, and that must be retried.
var errRefused = errors.New("the broker refuses the consumer")

// markReady closes sub.ready, once.
func (sub *subscription) markReady() { sub.readyOnce.Do(func() { close(sub.ready) }) }

func (sub *subscription) run(ctx context.Context) {
	s := sub.s
	defer s.subs.Done()
	defer close(sub.out)
	defer sub.markReady() // ended: nobody waits for it any more
	fields := watermill.LogFields{"queue": sub.queue}

	// At most 1s (±50%) between tries: once the broker is back, consuming resumes within
	// about 1.5s, however long it was gone (with 5s, make faults saw 2.05s after a kill -9).
	// The wait starts over only after a session that consumed (or was paused by a kill): one
	// that the broker refuses every time (541 for a quorum queue that is down, say) backs off.
	// Each failure is logged once, here: the Dialer leaves a lost connection to this line.
	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval = 100 * time.Millisecond
	retry.MaxInterval = time.Second
	retry.MaxElapsedTime = 0 // until closed
	retry.Reset()            // the first wait is InitialInterval, not the default's 500ms
	for {
		err := sub.session(ctx)
		switch {
		case err == nil: // closed
			return
		case errors.Is(err, errQueueGone) && sub.mode == draining:
			sub.removeKilled()
			return
		case errors.Is(err, errQueueGone), errors.Is(err, errRefused):
			// Deleted, or refused for good (access refused): retrying cannot help.
			s.logger.Error("Consumer stopped for good", err, fields)
			s.goneMu.Lock()
			s.gone = append(s.gone, fmt.Errorf("router: queue %q: %w", sub.queue, err))
			s.goneMu.Unlock()
			return
		}
		if sub.steady {
			retry.Reset()
		}
		if sub.steady && sub.onIsolated { // consumed there: back to the main connection
			sub.isolated = false
		}
		wait := retry.NextBackOff()
		s.logger.Error("Consumer lost its channel, reconnecting", err, fields.Add(watermill.LogFields{"in": wait}))
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		case <-s.closing:
			return
		}
	}
}

// session lasts as long as the subscription's channels on a connection (the main one, or the
// isolated one, see consumerConns): it listens to the kill topic and consumes the queue as
// the mode says. It returns nil once closed, errQueueGone once the queue is gone, or the error
// that lost a channel or the connection; sub.steady tells whether it got as far as consuming
// (or listening, paused by a kill).
func (sub *subscription) session(ctx context.Context) error {
	s := sub.s
	sub.steady = false
	cc := s.conns.main
	if sub.isolated {
		cc = s.conns.isolated
	}
	sub.onIsolated = sub.isolated
	conn, err := s.connectionOn(ctx, cc.Conn)
	if err != nil {
		return err
	}
	commands, stopListening, err := sub.listen(conn)
	if err != nil {
		return err
	}
	defer stopListening()
	if err := sub.recall(ctx, conn); err != nil {
		return err
	}
	for {
		if sub.mode == paused {
			sub.markReady() // listening, paused by a kill
			sub.steady = true
			select {
			case d, ok := <-commands:
				if !ok {
					return errors.New("kill topic listener closed")
				}
				sub.command(d)
			case <-ctx.Done():
				return nil
			case <-s.closing:
				return nil
			}
			continue
		}
		out, err := sub.consume(ctx, cc, conn, commands)
		if err != nil {
			return err
		}
		switch out {
		case closed:
			return nil
		case drained:
			gone, err := sub.awaitDeletion(ctx, conn)
			if err != nil || gone {
				return err
			}
		}
	}
}

// consume consumes the queue on a channel of its own of conn, cc's connection, until closed,
// killed or drained, or until an error: the channel or connection is lost, or the queue is
// deleted (errQueueGone).
func (sub *subscription) consume(ctx context.Context, cc *consumeConn, conn *amqp.Connection, commands <-chan amqp.Delivery) (outcome, error) {
	s := sub.s
	ch, err := conn.Channel()
	if err != nil {
		return closed, err
	}
	defer ch.Close()
	if err := ch.Qos(s.cfg.Prefetch, 0, false); err != nil {
		return closed, err
	}
	cancelled := ch.NotifyCancel(make(chan string, 1))
	closedBy := ch.NotifyClose(make(chan *amqp.Error, 1))
	tag := fmt.Sprintf("warren-%s-%d", s.cfg.HandlerName, consumerSeq.Add(1))
	cc.consuming.Lock() // one at a time: a refusal that closes conn is this consume's (see consumerConns)
	deliveries, err := ch.Consume(sub.queue, tag, false, false, false, false, nil)
	cc.consuming.Unlock()
	if closesConnection(err) && cc == s.conns.main {
		sub.isolated = true
		// The failure itself is logged once, by run.
		s.logger.Info("Consumer refused with a connection error: it retries on a connection of its own until it is served",
			watermill.LogFields{"queue": sub.queue})
	}
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code != amqp.NotFound && amqpx.IsPermanentBrokerError(err) {
		return closed, fmt.Errorf("%w: %v", errRefused, err)
	}
	if err != nil {
		return closed, sub.goneOr(conn, err)
	}
	sub.markReady()
	sub.steady = true

	cs := &channelState{
		acks:     newAcker(ch, s.cfg.Prefetch, s.logger),
		dups:     &copies{seen: &s.seen, live: map[string]int{}},
		stopping: make(chan struct{}),
		slots:    make(chan struct{}, s.cfg.Concurrency),
	}
	cs.hardStop, cs.hardFn = context.WithCancelCause(s.hardStop)
	defer cs.acks.close()
	defer func() { // the session's context goes once its last message is settled
		go func() {
			cs.inflight.Wait()
			cs.hardFn(context.Canceled)
		}()
	}()
	stop := func() {
		close(cs.stopping)
		sub.stop(ch, tag, deliveries, cs)
	}
	var drainTick <-chan time.Time
	if sub.mode == draining {
		t := time.NewTicker(drainCheck)
		defer t.Stop()
		drainTick = t.C
	}
	slot := false // a handler slot is held for the next delivery
	for {
		// A delivery is taken only with a free slot: at most Concurrency are handed out, the
		// rest of the prefetch waits, and commands, closing and the context are still heard.
		in, take := deliveries, (chan<- struct{})(nil)
		if !slot {
			in, take = nil, cs.slots
		}
		select {
		case take <- struct{}{}:
			slot = true
		case _, sent := <-cancelled:
			if !sent { // closed, not sent to, when the channel closes: deliveries ends too
				cancelled = nil
				continue
			}
			return closed, sub.cancelledByBroker(conn, stop, cs)
		case d, ok := <-in:
			if !ok {
				select {
				case _, sent := <-cancelled:
					if sent {
						return closed, sub.cancelledByBroker(conn, stop, cs)
					}
				default:
				}
				close(cs.stopping)
				return closed, channelLost(closedBy)
			}
			sub.recordLateness(d)
			id, _ := d.Headers[warren.PublishIDHeader].(string)
			if !cs.dups.claim(id) {
				s.logger.Info("Copy of a message handled already: acked", watermill.LogFields{"queue": sub.queue, "message_id": d.MessageId})
				cs.acks.settle(d.DeliveryTag, ack)
				continue
			}
			msg, done, deadLetter := sub.message(d, id, cs)
			if msg == nil {
				cs.dups.release(id, false) // poisoned, or put back: never taken for done
				continue
			}
			info, _ := warren.DeliveryFrom(msg.Context()) // read before the handler owns msg
			consumed := s.consumes.Get(sub.queue, info.Exchange)
			select {
			case sub.out <- msg:
				slot = false // settle frees it
				s.metrics.Consumed(context.Background(), consumed)
				cs.inflight.add()
				go sub.settle(cs, msg, d.DeliveryTag, id, done, deadLetter)
			case <-ctx.Done():
				done() // not handed out: back to the queue when the channel closes
				cs.dups.release(id, false)
				stop()
				return closed, nil
			case <-s.closing:
				done()
				cs.dups.release(id, false)
				stop()
				return closed, nil
			}
		case d, ok := <-commands:
			if !ok {
				stop()
				return closed, errors.New("kill topic listener closed")
			}
			before := sub.mode
			sub.command(d)
			switch {
			case sub.mode == paused:
				stop()
				sub.event("stopped", d, nil)
				sub.answer(d, before, paused, nil)
				return killed, nil
			case sub.mode == draining && before != draining:
				t := time.NewTicker(drainCheck)
				defer t.Stop()
				drainTick = t.C
			}
		case <-drainTick:
			if cs.inflight.n.Load() > 0 {
				continue
			}
			if q, err := inspect(conn, sub.queue); err == nil && q.Messages == 0 {
				stop()
				return drained, nil
			}
		case <-ctx.Done():
			stop()
			return closed, nil
		case <-s.closing:
			stop()
			return closed, nil
		}
	}
}

// channelState is what one consume channel's deliveries share: the acker, the messages
// handed out and not settled, the copies being handled, the handler slots, stopping,
// closed when the consumer stops (nothing waits to be requeued any more), and the parent
// of the context of its messages, ended when its stop outlives ShutdownTimeout. It is the
// session's own: a pause or a reconnect that ended it never cancels the messages that the
// next session hands out.
type channelState struct {
	acks     *acker
	inflight flights
	dups     *copies
	stopping chan struct{}
	slots    chan struct{} // one per message handed out, up to Concurrency
	hardStop context.Context
	hardFn   context.CancelCauseFunc
}

// flights counts the messages handed out and not settled yet.
type flights struct {
	sync.WaitGroup
	n atomic.Int64
}

func (f *flights) add() {
	f.n.Add(1)
	f.Add(1)
}

func (f *flights) done() {
	f.n.Add(-1)
	f.Done()
}

var consumerSeq, subscriptionSeq atomic.Uint64

// stop cancels the consumer and waits, up to ShutdownTimeout, for the messages handed out to
// be settled; their settlements go out together when the acker closes (see acker.hold). What
// was received but not handed out goes back to the queue when the channel closes: nacked
// one by one, it would make the quorum queue's channel stash the settlements that follow.
func (sub *subscription) stop(ch *amqp.Channel, tag string, deliveries <-chan amqp.Delivery, cs *channelState) {
	s := sub.s
	cs.acks.hold()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := amqpx.Do(ctx, ch, func() error { return ch.Cancel(tag, false) }); err == nil {
		for range deliveries { // closed once the broker confirmed the cancel
		}
	}
	done := make(chan struct{})
	go func() { cs.inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.logger.Error("Shutdown timeout: messages still in flight go back to the queue", ctx.Err(),
			watermill.LogFields{"queue": sub.queue, "timeout": s.cfg.ShutdownTimeout})
		cs.hardFn(errShutdownTimeout)
	}
}

// settle acks the delivery once the handler has acked msg (and remembers its publish id, see
// copies), and then ends msg's context. A nacked one goes back to the queue after
// RequeueDelay (at once when the consumer stops), or, if warren.DeadLetter was called, is
// rejected into the queue's dead-letter path.
func (sub *subscription) settle(cs *channelState, msg *message.Message, tag uint64, id string,
	done context.CancelFunc, deadLetter *atomic.Bool) {
	defer cs.inflight.done()
	defer func() { <-cs.slots }()
	defer done()
	select {
	case <-msg.Acked():
		cs.dups.release(id, true)
		cs.acks.settle(tag, ack)
	case <-msg.Nacked():
		cs.dups.release(id, false) // a reject lost with its channel must be handled again
		if deadLetter.Load() {
			cs.acks.settle(tag, reject)
			return
		}
		sub.requeueLater(tag, cs)
	}
}

// requeueLater returns the delivery to the queue after RequeueDelay, or at once when the
// consumer stops or the subscriber closes.
func (sub *subscription) requeueLater(tag uint64, cs *channelState) {
	t := time.NewTimer(sub.s.cfg.RequeueDelay)
	defer t.Stop()
	select {
	case <-t.C:
	case <-cs.stopping:
	case <-sub.s.closing:
	}
	cs.acks.settle(tag, requeue)
}

// errCancelledByBroker is why a session ends whose consumer the broker cancelled.
var errCancelledByBroker = errors.New("the broker cancelled the consumer")

// cancelledByBroker ends a session whose consumer the broker cancelled (basic.cancel) while
// its channel stays open: a queue deleted, a classic queue whose node went down, and from
// RabbitMQ 4.3 a quorum queue's consumer that held a message past its consumer timeout (the
// broker has put that message back in the queue). Nothing more is handed out; the messages
// in flight get up to ShutdownTimeout to finish and are settled on the channel, which the
// broker still takes their settlements on, so that none of them is delivered again (closing
// the channel at once would return every one of them to the queue); what was received but
// not handed out goes back to the queue when the channel closes. It returns errQueueGone if
// the queue no longer exists, and otherwise an error that makes the subscription consume
// again.
func (sub *subscription) cancelledByBroker(conn *amqp.Connection, stop func(), cs *channelState) error {
	sub.s.logger.Info("The broker cancelled the consumer: the messages in flight finish and are settled; it consumes again unless the queue was deleted",
		watermill.LogFields{"queue": sub.queue, "in_flight": cs.inflight.n.Load()})
	stop()
	return sub.goneOr(conn, errCancelledByBroker)
}

// channelLost returns the error of a consume channel that closed: the broker's reason when it
// closed the channel (such as a consumer timeout before RabbitMQ 4.3: 406 PRECONDITION_FAILED,
// "delivery acknowledgement on channel N timed out"), else the connection's loss.
func channelLost(closedBy <-chan *amqp.Error) error {
	select {
	case err, ok := <-closedBy:
		if ok && err != nil {
			return fmt.Errorf("channel closed: %w", err)
		}
	default:
	}
	return errors.New("channel closed")
}

// closesConnection reports whether err is the broker's refusal that closes the whole
// connection (an AMQP connection exception, such as 541 INTERNAL_ERROR), not only a channel.
// 320 CONNECTION_FORCED is no refusal: the broker stops, or an operator closed the connection.
func closesConnection(err error) bool {
	var ae *amqp.Error
	return errors.As(err, &ae) && ae.Server && !ae.Recover && ae.Code != amqp.ConnectionForced
}

// goneOr returns errQueueGone (wrapping err) if the queue no longer exists, and err otherwise:
// a cancelled consumer, or a queue reported "down or inaccessible", is consumed again.
func (sub *subscription) goneOr(conn *amqp.Connection, err error) error {
	if conn.IsClosed() { // the broker closed it (541 for a queue that is down, say): nothing to ask
		return err
	}
	_, ierr := inspect(conn, sub.queue)
	if amqpx.IsNotFound(ierr) {
		return fmt.Errorf("%w: %v", errQueueGone, err)
	}
	if ierr != nil {
		return fmt.Errorf("%w (and the queue cannot be inspected: %v)", err, ierr)
	}
	return fmt.Errorf("%w; queue %s still exists: consuming again", err, sub.queue)
}

// message unmarshals d and gives it its context, which ends when done is called (once the
// message is settled), or when the subscriber has closed. A delivery that cannot be
// unmarshaled, or whose headers the client could not read, goes to the poison queue and nil
// is returned.
func (sub *subscription) message(d amqp.Delivery, id string, cs *channelState) (
	msg *message.Message, done context.CancelFunc, deadLetter *atomic.Bool) {
	viaDelay := strings.HasPrefix(d.Exchange, sub.s.viaDelay)
	info := warren.Delivery{Queue: sub.queue, Exchange: d.Exchange, RoutingKey: d.RoutingKey, Redelivered: d.Redelivered}
	info.PublishID = id
	if viaDelay { // its destination: an exchange, or the queue through the default exchange
		info.Exchange, _ = d.Headers[warren.DestExchangeHeader].(string)
	}
	var err error
	if why, unreadable := d.Headers[warren.UnreadableHeader].(string); unreadable {
		err = &unreadableError{why}
	} else {
		msg, err = sub.s.cfg.Marshaler.Unmarshal(d)
	}
	if err != nil {
		sub.poisonUndecodable(d, info, err, cs)
		return nil, nil, nil
	}
	// warren's bookkeeping is believed only where warren put it: see Subscriber.
	direct := (d.Exchange == "" && d.RoutingKey == sub.queue) ||
		(viaDelay && d.Headers[warren.DestQueueHeader] == sub.queue)
	retry := direct && msg.Metadata.Get(warren.RetryQueueKey) == sub.queue
	for k := range msg.Metadata {
		if k == warren.MetadataRedelivered || !retry && warren.IsAttemptBookkeeping(k) ||
			!direct && warren.IsPoisonBookkeeping(k) {
			delete(msg.Metadata, k)
		}
	}
	deadLetter = new(atomic.Bool)
	ctx, done := context.WithCancel(warren.WithDeadLetter(warren.WithDelivery(cs.hardStop, info), deadLetter))
	msg.SetContext(ctx)
	if d.Redelivered {
		msg.Metadata.Set(warren.MetadataRedelivered, "true")
	}
	return msg, done, deadLetter
}

// recordLateness records how late a delivery that came through the delay levels arrived
// after the time it was due (warren.DueHeader).
func (sub *subscription) recordLateness(d amqp.Delivery) {
	if due, ok := d.Headers[warren.DueHeader].(int64); ok && strings.HasPrefix(d.Exchange, sub.s.viaDelay) {
		sub.s.metrics.Late(context.Background(), sub.lateness, time.UnixMicro(due), time.Now())
	}
}

// unreadableError is the reason of a delivery whose headers the client could not read.
type unreadableError struct{ why string }

func (e *unreadableError) Error() string { return "the client cannot read its headers: " + e.why }

// poisonUndecodable publishes d as it is to the poison queue, with the reason, and settles
// it: acked once the poison copy is confirmed; rejected into the queue's dead-letter path if
// the copy is too large to publish; else requeued after RequeueDelay. It is never dropped.
func (sub *subscription) poisonUndecodable(d amqp.Delivery, info warren.Delivery, cause error,
	cs *channelState) {
	s := sub.s
	reason, failure := warren.PoisonReasonUndecoded, fmt.Errorf("unmarshal: %w", cause)
	var unreadable *unreadableError
	if errors.As(cause, &unreadable) {
		reason, failure = warren.PoisonReasonUnreadable, cause
	}
	headers := amqp.Table{}
	for k, v := range d.Headers {
		if !warren.IsBookkeeping(k) {
			headers[k] = v
		}
	}
	// Every property is kept but two (see warren.Marshaler): the user-id, which the broker
	// refuses from another user, as a header; the expiration, which would expire the copy in
	// the poison queue, in the poison record, which a replay restores it from.
	if _, ok := headers[warren.MetadataUserID]; !ok && d.UserId != "" {
		headers[warren.MetadataUserID] = d.UserId
	}
	now := time.Now()
	warren.PoisonRecord{
		Error: failure.Error(), ErrorType: warren.ErrorType(failure), Reason: reason, Handler: s.cfg.HandlerName,
		Queue: sub.queue, Origin: &warren.Origin{Exchange: info.Exchange, RoutingKey: info.RoutingKey},
		Attempts: 1, FirstFailure: now, LastFailure: now, TraceID: traceID(d.Headers), Expiration: d.Expiration,
	}.EncodeTable(headers)
	pub := amqp.Publishing{
		Headers: headers, Body: d.Body, MessageId: d.MessageId, ContentType: d.ContentType,
		ContentEncoding: d.ContentEncoding, DeliveryMode: amqp.Persistent, Timestamp: d.Timestamp,
		CorrelationId: d.CorrelationId, ReplyTo: d.ReplyTo, Type: d.Type, AppId: d.AppId, Priority: d.Priority,
	}
	fields := watermill.LogFields{"queue": sub.queue, "message_id": d.MessageId, "reason": reason}
	if size, err := amqpx.HeaderFrameSize(pub); err != nil || size > amqpx.MaxHeaderFrame {
		s.logger.Error("Undecodable message too large to poison: rejected into its queue's dead-letter path", cause, fields)
		cs.acks.settle(d.DeliveryTag, reject)
		s.metrics.Poisoned(context.Background(), sub.queue, warren.PoisonReasonRejected)
		return
	}
	if err := sub.publishPoison(pub); err != nil {
		s.logger.Error("Cannot poison an undecodable message: requeued", err, fields)
		cs.inflight.add()
		go func() {
			defer cs.inflight.done()
			sub.requeueLater(d.DeliveryTag, cs)
		}()
		return
	}
	s.logger.Error("Undecodable message poisoned", cause, fields)
	cs.acks.settle(d.DeliveryTag, ack)
	s.metrics.Poisoned(context.Background(), sub.queue, reason)
}

// publishPoison publishes pub to the queue's poison queue on a confirm channel of its own of
// the publishing connection (see consumerConns), declaring the queue's topology first (its
// poison queue may have been deleted), and returns nil once the broker has confirmed it and
// not returned it.
func (sub *subscription) publishPoison(pub amqp.Publishing) error {
	ctx, cancel := context.WithTimeout(context.Background(), sub.s.cfg.Connection.ConnectTimeout)
	defer cancel()
	conn, err := sub.s.conns.publish.Get(ctx)
	if err != nil {
		return err
	}
	pc, err := conn.Channel()
	if err != nil {
		return err
	}
	defer pc.Close()
	if err := sub.s.builder.DeclareQueue(ctx, pc, sub.s.queue(sub.queue)); err != nil {
		return err
	}
	return amqpx.PublishConfirmed(ctx, pc, "", topology.PoisonQueue(sub.queue), true, pub)
}
