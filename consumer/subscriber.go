package consumer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/consumerconns"
	"github.com/warrenmq/warren/internal/telemetry"
	"github.com/warrenmq/warren/topology"
)

// Subscriber is a Watermill message.Subscriber for RabbitMQ work queues. Unlike
// watermill-amqp's, it hands out up to Concurrency messages at once, so a Watermill router
// processes them concurrently; it closes gracefully; and it keeps consuming after the broker
// drops its connection. The topic of Subscribe is the name of the queue to consume. Its
// subscriptions share one connection, each on channels of its own (a router.Router's handlers
// share the router's: see package router).
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
// A copy of a message this subscriber acked in the last minutes (same contract.PublishIDHeader:
// a publisher's re-send after a lost confirm, a redelivery after a lost ack) is acked at once
// and not handed out again. Copies that reach different processes are recognised only by a
// store the processes share: see router.Config.CopyStore.
//
// A message is handed out with warren.Delivery and contract.DeadLetter in its context. warren's
// bookkeeping headers (see warren.IsBookkeeping) are believed only where warren put them:
// the attempt bookkeeping (warren.IsAttemptBookkeeping) only on a retry of this queue,
// that is a message that came straight to the queue through the default exchange, or through
// the delay levels addressed to the queue, and whose warren.RetryQueueKey names the queue
// (middleware.Backoff sets it on every retry); the poison record only on a message that came
// straight to the queue (a poison queue's consumer reads it). On any other message they are
// dropped, so that a copy forwarded from another queue (by any publisher), or a foreign or
// forged attempt count or poison header, starts at attempt 1. watermill-amqp's redelivered flag is set from
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
	cfg     Config
	logger  watermill.LoggerAdapter
	builder *topology.Builder
	conns   *consumerconns.Conns // its own, or its router's
	ownConn bool                 // Close closes conns
	listed  map[string]topology.Queue
	// viaDelay starts the name of every delay level exchange: a delivery from one came
	// through the delay levels.
	viaDelay string
	// callerSettles: the receiver of the messages settles each (contract.Settle) once it has
	// acked or nacked it; else a goroutine per message waits for that.
	callerSettles bool

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

	heldMu     sync.Mutex
	heldStates map[string]*heldState // by queue ordered by key (guarded by heldMu)

	metrics   *telemetry.Instruments
	consumes  telemetry.Consumes // attribute sets of messaging.client.consumed.messages
	answering sync.WaitGroup     // answers to kill commands being published
}

// errSubscriberClosed is the error of a call on a closed Subscriber: permanent, so that no
// retry waits for the time limit.
var errSubscriberClosed = amqpx.GiveUp(fmt.Errorf("consumer: subscriber is %w", warren.ErrClosed))

// errShutdownTimeout ends the context of the messages still in flight when ShutdownTimeout
// has passed.
var errShutdownTimeout = errors.New("shutdown timeout: the message goes back to its queue")

var _ message.Subscriber = (*Subscriber)(nil)

// NewSubscriber returns a Subscriber; it connects on the first Subscribe. Its subscriptions
// share a connection of its own (see consumerconns.Conns), which Close closes.
func NewSubscriber(config Config, logger watermill.LoggerAdapter) (*Subscriber, error) {
	return newSubscriber(config, logger, nil)
}

// NewSubscriberOn returns a Subscriber of config that consumes on conns, which it never
// closes: their owner closes them once every Subscriber on them is closed. Its caller settles
// every message it receives from it: once it has acked or nacked one, it calls
// contract.Settle with the message's context (a message's ack alone settles nothing). A
// router builds its handlers' Subscribers so, on the connections they share; conns's type is
// internal, so only warren's own packages call it.
func NewSubscriberOn(conns *consumerconns.Conns, config Config, logger watermill.LoggerAdapter) (*Subscriber, error) {
	s, err := newSubscriber(config, logger, conns)
	if err != nil {
		return nil, err
	}
	s.callerSettles = true
	return s, nil
}

// newSubscriber is NewSubscriber on conns, which the Subscriber does not close, or, when
// conns is nil, on connections of its own.
func newSubscriber(config Config, logger watermill.LoggerAdapter, conns *consumerconns.Conns) (*Subscriber, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config = config.WithDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	own := conns == nil
	if own {
		conns = consumerconns.New(config.Connection, "warren subscriber "+config.HandlerName, nil, logger)
	}
	builder, err := topology.NewBuilder(config.Topology, logger)
	if err != nil {
		return nil, err
	}
	metrics, err := telemetry.New(config.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
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

// queue returns the queue called name as declared: listed in Config.Queues, or a
// work queue with the defaults.
func (s *Subscriber) queue(name string) topology.Queue {
	q := s.listed[name]
	q.Name = name
	return q
}

// laneOf returns the queue ordered by key, listed in Config.Queues, that queue is a lane of
// (topology.LaneQueue), and true; else queue and false.
func (s *Subscriber) laneOf(queue string) (string, bool) {
	if home, lane, ok := topology.ParseLane(queue); ok && lane < s.listed[home].Lanes {
		return home, true
	}
	return queue, false
}

// Subscribe declares queue (a work queue, with its poison queue) and consumes it until ctx
// ends or the subscriber is closed. A lane of a queue ordered by key that Config.Queues lists
// (topology.LaneQueue) is declared with that queue, shares its poison queue and kill topic,
// and hands out one message of an order key at a time, in the order of the lane.
func (s *Subscriber) Subscribe(ctx context.Context, queue string) (<-chan *message.Message, error) {
	out := make(chan *message.Message)
	if _, err := s.subscribe(ctx, queue, out, true); err != nil {
		return nil, err
	}
	return out, nil
}

// SubscribeInto is Subscribe handing the messages out on out, which several subscriptions
// may share (a router's handler of a queue ordered by key reads its lanes' so, with no hop in
// between); out is not closed: the channel returned is, once the subscription has ended.
func (s *Subscriber) SubscribeInto(ctx context.Context, queue string, out chan<- *message.Message) (<-chan struct{}, error) {
	return s.subscribe(ctx, queue, out, false)
}

func (s *Subscriber) subscribe(ctx context.Context, queue string, out chan<- *message.Message, closeOut bool) (<-chan struct{}, error) {
	if err := s.SubscribeInitialize(queue); err != nil {
		return nil, err
	}
	home, ordered := s.laneOf(queue)
	sub := &subscription{s: s, queue: home, consumed: queue, ordered: ordered, out: out, closeOut: closeOut, over: make(chan struct{}),
		ready: make(chan struct{}), lateness: telemetry.QueueOptions(queue),
		id: self().id + "-" + strconv.FormatUint(subscriptionSeq.Add(1), 10)}
	if ordered {
		_, lane, _ := topology.ParseLane(queue)
		sub.holds = &laneHolds{keys: map[string]*heldKey{}, queue: topology.HeldQueue(home, lane)}
	}
	s.mu.Lock() // no subscription begins once Close waits for them
	if s.closed {
		s.mu.Unlock()
		return nil, errSubscriberClosed
	}
	s.subs.Add(1)
	s.mu.Unlock()
	s.readyMu.Lock()
	s.readies = append(s.readies, sub.ready)
	s.readyMu.Unlock()
	go sub.run(ctx)
	return sub.over, nil
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

// SubscribeInitialize declares queue without consuming it (a lane: see
// topology.Builder.DeclareLane).
func (s *Subscriber) SubscribeInitialize(queue string) error {
	return amqpx.RetryLogged(context.Background(), s.cfg.Connection.ConnectTimeout, "consumer: declare "+queue, s.logger, nil, func(ctx context.Context) error {
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
		if home, lane, ok := topology.ParseLane(queue); ok && lane < s.listed[home].Lanes {
			return amqpx.GiveUpIfRefused(b.DeclareLane(ctx, ch, s.queue(home), lane))
		}
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
		err = s.conns.Close()
	}
	s.answering.Wait() // bounded by replyTimeout; on a Subscriber's own connection, closed: at once
	return err
}

// Err reports the subscriptions that ended for good, naming each queue: their queue was
// deleted (not by a kill command's delete), or the broker refused them for good (access
// refused); nil if none did.
func (s *Subscriber) Err() error {
	s.goneMu.Lock()
	defer s.goneMu.Unlock()
	return errors.Join(s.gone...)
}
