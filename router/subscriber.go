package router

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v4"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/topology"
)

// SubscriberConfig configures a Subscriber.
type SubscriberConfig struct {
	// URL of the broker. Required.
	URL string
	// Topology configures the builder that declares the queues subscribed to.
	Topology topology.Config
	// Queues lists queues with options of their own (type, delivery limit); any other
	// queue subscribed to is declared as a work queue with the defaults.
	Queues []topology.Queue
	// Concurrency is how many messages of one subscription are handed out at once (the
	// prefetch). Watermill's router processes each in a goroutine of its own. Default 64.
	Concurrency int
	// ShutdownTimeout bounds how long closing waits for the messages handed out to be
	// acked. Default 30s.
	ShutdownTimeout time.Duration
	// ConnectTimeout bounds connecting and declaring in Subscribe. Default 30s.
	ConnectTimeout time.Duration
	// Marshaler defaults to warren.Marshaler{}. A delivery it cannot unmarshal goes to the
	// poison queue with the reason.
	Marshaler wamqp.Marshaler
	// HandlerName is recorded in the poison headers of deliveries that cannot be
	// unmarshaled, and in kill events.
	HandlerName string
	// KillSecret, when set, makes the subscriber obey only kill commands signed with it
	// (see Killer); others are refused and logged.
	KillSecret []byte
	// KillMaxAge bounds the age of a signed kill command, against replays. Default 1m.
	KillMaxAge time.Duration
	// OnKill, when set, is told what each subscription does about the kill topic.
	OnKill func(KillEvent)
}

// WithDefaults returns c with every unset field set to its default.
func (c SubscriberConfig) WithDefaults() SubscriberConfig {
	c.Topology = c.Topology.WithDefaults()
	if c.Concurrency == 0 {
		c.Concurrency = 64
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = 30 * time.Second
	}
	if c.ConnectTimeout == 0 {
		c.ConnectTimeout = 30 * time.Second
	}
	if c.Marshaler == nil {
		c.Marshaler = warren.Marshaler{}
	}
	if c.KillMaxAge == 0 {
		c.KillMaxAge = time.Minute
	}
	return c
}

// Validate reports the first field of c that is not usable.
func (c SubscriberConfig) Validate() error {
	if c.URL == "" {
		return errors.New("router: SubscriberConfig.URL is empty")
	}
	if _, err := amqp.ParseURI(c.URL); err != nil {
		return fmt.Errorf("router: SubscriberConfig.URL: %w", err)
	}
	if c.Concurrency < 0 || c.Concurrency > 65535 {
		return fmt.Errorf("router: SubscriberConfig.Concurrency %d is outside 1..65535", c.Concurrency)
	}
	if c.ShutdownTimeout < 0 || c.ConnectTimeout < 0 || c.KillMaxAge < 0 {
		return errors.New("router: SubscriberConfig: ShutdownTimeout, ConnectTimeout and KillMaxAge must not be negative")
	}
	if err := c.Topology.Validate(); err != nil {
		return err
	}
	return topology.Topology{Queues: c.Queues}.Validate()
}

// Subscriber is a Watermill message.Subscriber for RabbitMQ work queues. Unlike
// watermill-amqp's, it hands out up to Concurrency messages at once, so a Watermill router
// processes them concurrently; it closes gracefully; and it keeps consuming after the broker
// drops its connection. The topic of Subscribe is the name of the queue to consume.
//
// Closing (or cancelling Subscribe's context) stops taking messages: the consumer is
// cancelled, messages received but not handed out go back to the queue at once, and the
// messages handed out are waited for, up to ShutdownTimeout, to be acked or nacked before
// the channel closes. Nothing is lost, and a handler that finishes in time never sees its
// message again.
//
// A queue deleted under a consumer stops that subscription (its channel of messages is
// closed): the queue is not declared again and no empty message is handed out.
//
// Every subscription listens to its queue's kill topic (see Killer) on an exclusive queue of
// its own: a stop command pauses it (it stops as on closing, but keeps listening), a resume
// lifts that, and a delete command makes it consume until the queue is empty and then delete
// the queue and end. A kill is remembered by the broker, so a subscription that starts after
// one does not consume until a resume.
type Subscriber struct {
	cfg     SubscriberConfig
	logger  watermill.LoggerAdapter
	builder *topology.Builder
	listed  map[string]topology.Queue

	mu     sync.Mutex
	conn   *amqp.Connection
	closed bool

	closing  chan struct{} // closed by Close
	hardStop context.Context
	hardFn   context.CancelFunc
	subs     sync.WaitGroup
}

var _ message.Subscriber = (*Subscriber)(nil)

// NewSubscriber returns a Subscriber; it connects on the first Subscribe.
func NewSubscriber(config SubscriberConfig, logger watermill.LoggerAdapter) (*Subscriber, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config = config.WithDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	builder, err := topology.NewBuilder(config.Topology, logger)
	if err != nil {
		return nil, err
	}
	s := &Subscriber{
		cfg: config, logger: logger, builder: builder,
		listed:  map[string]topology.Queue{},
		closing: make(chan struct{}),
	}
	for _, q := range config.Queues {
		s.listed[q.Name] = q
	}
	// The context of every message handed out: not cancelled by closing, so that handlers
	// in flight can finish, but once ShutdownTimeout has passed.
	s.hardStop, s.hardFn = context.WithCancel(context.Background())
	return s, nil
}

// connection returns the open connection, dialling when there is none.
func (s *Subscriber) connection() (*amqp.Connection, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("router: subscriber is closed")
	}
	if s.conn != nil && !s.conn.IsClosed() {
		return s.conn, nil
	}
	conn, err := amqpx.Dial(s.cfg.URL, "warren subscriber "+s.cfg.HandlerName, s.cfg.ConnectTimeout)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	s.conn = conn
	return conn, nil
}

// Subscribe declares queue (a work queue, with its poison queue) and consumes it until ctx
// ends or the subscriber is closed.
func (s *Subscriber) Subscribe(ctx context.Context, queue string) (<-chan *message.Message, error) {
	if err := s.SubscribeInitialize(queue); err != nil {
		return nil, err
	}
	out := make(chan *message.Message)
	sub := &subscription{s: s, queue: queue, out: out}
	s.subs.Add(1)
	go sub.run(ctx)
	return out, nil
}

// SubscribeInitialize declares queue without consuming it.
func (s *Subscriber) SubscribeInitialize(queue string) error {
	return amqpx.Retry(context.Background(), s.cfg.ConnectTimeout, "router: declare "+queue, func(ctx context.Context) error {
		conn, err := s.connection()
		if err != nil {
			return err
		}
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		defer ch.Close()
		q := s.listed[queue]
		q.Name = queue
		return amqpx.PermanentIfRefused(s.builder.DeclareQueue(ctx, ch, q))
	})
}

// Close stops every subscription as described on Subscriber, then closes the connection.
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
	s.hardFn()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != nil && !s.conn.IsClosed() {
		return s.conn.Close()
	}
	return nil
}

type subscription struct {
	s     *Subscriber
	queue string
	out   chan *message.Message

	// Set by the kill topic; they outlive a lost connection.
	mode mode
	last time.Time // of the newest command accepted
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

func (sub *subscription) run(ctx context.Context) {
	s := sub.s
	defer s.subs.Done()
	defer close(sub.out)
	fields := watermill.LogFields{"queue": sub.queue}

	retry := backoff.NewExponentialBackOff()
	retry.InitialInterval = 100 * time.Millisecond
	retry.MaxInterval = 5 * time.Second
	retry.MaxElapsedTime = 0 // until closed
	for {
		started, err := sub.session(ctx)
		switch {
		case err == nil: // closed
			return
		case errors.Is(err, errQueueGone) && sub.mode == draining:
			sub.removeKilled()
			return
		case errors.Is(err, errQueueGone):
			s.logger.Error("Queue deleted: consumer stopped", err, fields)
			return
		}
		if started {
			retry.Reset()
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

// session lasts as long as a connection: it listens to the kill topic and consumes the queue
// as the mode says. It returns nil once closed, errQueueGone once the queue is gone, or the
// error that lost the connection; started reports whether it got as far as listening.
func (sub *subscription) session(ctx context.Context) (started bool, err error) {
	s := sub.s
	conn, err := s.connection()
	if err != nil {
		return false, err
	}
	commands, stopListening, err := sub.listen(conn)
	if err != nil {
		return false, err
	}
	defer stopListening()
	if err := sub.recall(conn); err != nil {
		return true, err
	}
	for {
		if sub.mode == paused {
			select {
			case d, ok := <-commands:
				if !ok {
					return true, errors.New("kill topic listener closed")
				}
				sub.command(d)
			case <-ctx.Done():
				return true, nil
			case <-s.closing:
				return true, nil
			}
			continue
		}
		out, err := sub.consume(ctx, conn, commands)
		if err != nil {
			return true, err
		}
		switch out {
		case closed:
			return true, nil
		case drained:
			gone, err := sub.awaitDeletion(ctx, conn)
			if err != nil || gone {
				return true, err
			}
		}
	}
}

// consume consumes the queue until closed, killed or drained, or until an error: the
// channel or connection is lost, or the queue is deleted (errQueueGone).
func (sub *subscription) consume(ctx context.Context, conn *amqp.Connection, commands <-chan amqp.Delivery) (outcome, error) {
	s := sub.s
	ch, err := conn.Channel()
	if err != nil {
		return closed, err
	}
	defer ch.Close()
	if err := ch.Qos(s.cfg.Concurrency, 0, false); err != nil {
		return closed, err
	}
	cancelled := ch.NotifyCancel(make(chan string, 1))
	tag := fmt.Sprintf("warren-%s-%d", s.cfg.HandlerName, consumerSeq.Add(1))
	deliveries, err := ch.Consume(sub.queue, tag, false, false, false, false, nil)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return closed, fmt.Errorf("%w: %v", errQueueGone, err)
		}
		return closed, err
	}

	acks := newAcker(ch, s.cfg.Concurrency, s.logger)
	defer acks.close()
	var inflight flights
	stop := func() { sub.stop(ch, tag, deliveries, &inflight.WaitGroup, acks) }
	var drainTick <-chan time.Time
	if sub.mode == draining {
		t := time.NewTicker(drainCheck)
		defer t.Stop()
		drainTick = t.C
	}
	for {
		select {
		case d, ok := <-deliveries:
			if !ok {
				select {
				case _, ok := <-cancelled: // closed, not sent to, when the channel closes
					if ok {
						return closed, errQueueGone
					}
				default:
				}
				return closed, errors.New("channel closed")
			}
			msg, done := sub.message(conn, d, acks)
			if msg == nil {
				continue
			}
			select {
			case sub.out <- msg:
				inflight.add()
				go settle(&inflight, msg, d.DeliveryTag, acks, done)
			case <-ctx.Done():
				done()
				acks.settle(d.DeliveryTag, false)
				stop()
				return closed, nil
			case <-s.closing:
				done()
				acks.settle(d.DeliveryTag, false)
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
				return killed, nil
			case sub.mode == draining && before != draining:
				t := time.NewTicker(drainCheck)
				defer t.Stop()
				drainTick = t.C
			}
		case <-drainTick:
			if inflight.n.Load() > 0 {
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

var consumerSeq atomic.Uint64

// stop cancels the consumer, returns what was received but not handed out to the queue and
// waits, up to ShutdownTimeout, for the messages handed out to be settled.
func (sub *subscription) stop(ch *amqp.Channel, tag string, deliveries <-chan amqp.Delivery, inflight *sync.WaitGroup, acks *acker) {
	s := sub.s
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := amqpx.Do(ctx, ch, func() error { return ch.Cancel(tag, false) }); err == nil {
		for d := range deliveries { // closed once the broker confirmed the cancel
			acks.settle(d.DeliveryTag, false)
		}
	}
	done := make(chan struct{})
	go func() { inflight.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.logger.Error("Shutdown timeout: messages still in flight go back to the queue", ctx.Err(),
			watermill.LogFields{"queue": sub.queue, "timeout": s.cfg.ShutdownTimeout})
		s.hardFn()
	}
}

// settle acks or nacks (and requeues) the delivery once the handler has acked or nacked msg,
// and then ends msg's context.
func settle(inflight *flights, msg *message.Message, tag uint64, acks *acker, done context.CancelFunc) {
	defer inflight.done()
	defer done()
	select {
	case <-msg.Acked():
		acks.settle(tag, true)
	case <-msg.Nacked():
		acks.settle(tag, false)
	}
}

// message unmarshals d and gives it its context, which ends when done is called (once the
// message is settled), or when the subscriber has closed. A delivery that cannot be
// unmarshaled goes to the poison queue and nil is returned.
func (sub *subscription) message(conn *amqp.Connection, d amqp.Delivery, acks *acker) (msg *message.Message, done context.CancelFunc) {
	info := warren.Delivery{Queue: sub.queue, Exchange: d.Exchange, RoutingKey: d.RoutingKey, Redelivered: d.Redelivered}
	if x, ok := d.Headers[topology.HeaderDestExchange].(string); ok {
		info.Exchange = x // came through the delay levels
	} else if _, ok := d.Headers[topology.HeaderDestQueue]; ok {
		info.Exchange = ""
	}
	msg, err := sub.s.cfg.Marshaler.Unmarshal(d)
	if err != nil {
		acks.settle(d.DeliveryTag, sub.poisonUndecodable(conn, d, info, err))
		return nil, nil
	}
	ctx, done := context.WithCancel(warren.WithDelivery(sub.s.hardStop, info))
	msg.SetContext(ctx)
	if d.Redelivered {
		msg.Metadata.Set(wamqp.MetadataRedeliveredKey, "true")
	}
	return msg, done
}

// poisonUndecodable publishes d as it is to the poison queue, with the reason, and reports
// whether it did: then d is acked, else requeued. It is never dropped.
func (sub *subscription) poisonUndecodable(conn *amqp.Connection, d amqp.Delivery, info warren.Delivery, cause error) bool {
	s := sub.s
	now := time.Now().UTC().Format(time.RFC3339Nano)
	headers := amqp.Table{}
	for k, v := range d.Headers {
		if !warren.IsBrokerHeader(k) {
			headers[k] = v
		}
	}
	for k, v := range map[string]string{
		middleware.PoisonErrorKey:      "unmarshal: " + cause.Error(),
		middleware.PoisonErrorTypeKey:  fmt.Sprintf("%T", cause),
		middleware.PoisonReasonKey:     middleware.PoisonReasonUndecoded,
		middleware.PoisonHandlerKey:    s.cfg.HandlerName,
		middleware.PoisonQueueKey:      sub.queue,
		middleware.PoisonExchangeKey:   info.Exchange,
		middleware.PoisonRoutingKeyKey: info.RoutingKey,
		middleware.PoisonAttemptsKey:   strconv.Itoa(1),
		middleware.PoisonFirstFailKey:  now,
		middleware.PoisonLastFailKey:   now,
	} {
		headers[k] = v
	}
	pub := amqp.Publishing{
		Headers: headers, Body: d.Body, MessageId: d.MessageId, ContentType: d.ContentType,
		ContentEncoding: d.ContentEncoding, DeliveryMode: amqp.Persistent, Timestamp: d.Timestamp,
	}
	err := func() error {
		pc, err := conn.Channel() // confirms on a channel of its own
		if err != nil {
			return err
		}
		defer pc.Close()
		if err := pc.Confirm(false); err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.ConnectTimeout)
		defer cancel()
		dc, err := pc.PublishWithDeferredConfirmWithContext(ctx, "", topology.PoisonQueue(sub.queue), true, false, pub)
		if err != nil {
			return err
		}
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("not confirmed: %v", err)
		}
		return nil
	}()
	fields := watermill.LogFields{"queue": sub.queue, "message_id": d.MessageId}
	if err != nil {
		s.logger.Error("Cannot poison an undecodable message: requeued", err, fields)
		return false
	}
	s.logger.Error("Undecodable message poisoned", cause, fields)
	return true
}
