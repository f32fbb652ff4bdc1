package router

import (
	"errors"
	"fmt"
	"slices"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/consumer"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/topology"
)

// HandlerConfig says what a handler consumes and how.
type HandlerConfig struct {
	// Name of the handler; default Queue. Names are unique within a router.
	Name string
	// Queue consumed. Every consumer of a queue, in any process, competes for its
	// messages. Required.
	Queue string
	// Exchange, when set, is bound to Queue with each of Keys: Queue is then a consumer
	// group of that exchange's topic (every group gets every message; a group's consumers
	// compete). An exchange not listed in Config.Declare is of kind Topology.ExchangeKind.
	Exchange string
	Keys     []string
	// Concurrency overrides Config.Concurrency.
	Concurrency int
	// Retry overrides Config.Retry (its Publisher and MeterProvider are the router's too).
	Retry *middleware.BackoffConfig
	// PublishTopic is where the messages the handler returns are published, inside the
	// middleware chain: a failure to publish them is a failure of the handler, retried on its
	// schedule and then poisoned (a message that can never be published, e.g. unroutable, is
	// poisoned at once).
	PublishTopic string
	// Reply makes the handler a request/reply server (see package rpc): the messages it
	// returns are published to the request's reply-to, with its correlation id, inside the
	// middleware chain (a failure to publish them fails the handler; a reply to a caller
	// that is gone is dropped, and the request acked), and a request that is poisoned is
	// answered with an error reply. A request without reply-to gets no reply. PublishTopic must then be empty.
	Reply bool
	// Lanes, above 0, consumes Queue ordered by key (docs/ordering.md): the queue's Lanes
	// lane queues, shared with the other processes that run the handler, and the queue
	// itself. Config.Declare must list the queue with the same topology.Queue.Lanes: from
	// there the router's publishers route by key. The messages of one order key
	// (warren.OrderBy) are handled one at a time, in the order of their lane; different keys
	// concurrently, up to Concurrency a lane. A failed message is retried in place (see
	// middleware.BackoffConfig.InPlace), holding only its key. A message of the queue itself,
	// which has no lane, is handled as it comes. Not with Exchange or Reply.
	Lanes int
	// GoOnAfterPoison, with Lanes, goes on with a key's next message once one of the key is
	// poisoned. By default the key is held: its later messages wait, parked on the broker,
	// until an operator releases them (handled in order) or skips them (poisoned), with
	// `warren held` or package ops (docs/ordering.md).
	GoOnAfterPoison bool
	// Middleware run inside the default chain, around the handler itself (inside Backoff,
	// Poison and Recoverer: see Router). This is the place of a middleware.Idempotent that
	// makes a business operation happen once per message id (middleware.MessageIDKey) or per
	// key of the handler's own: there "processed" means the handler succeeded, and a failure
	// or a panic gives the key up for the retry.
	Middleware []message.HandlerMiddleware
}

// validate reports the first field of h that is not usable.
func (h HandlerConfig) validate() error {
	switch {
	case h.Queue == "":
		return errors.New("router: HandlerConfig.Queue is empty")
	case h.Exchange != "" && len(h.Keys) == 0:
		return fmt.Errorf("router: handler %s: HandlerConfig.Keys is empty: Exchange %q is bound to the queue with each key "+
			"(for a fanout exchange, Keys: []string{\"\"})", h.Name, h.Exchange)
	case h.Reply && h.PublishTopic != "":
		return fmt.Errorf("router: handler %s: HandlerConfig.PublishTopic %q is set with Reply: a replying handler's "+
			"messages go to the request's reply-to", h.Name, h.PublishTopic)
	case h.Exchange == "" && len(h.Keys) > 0:
		return fmt.Errorf("router: handler %s: HandlerConfig.Exchange is empty: Keys %q bind the queue to it", h.Name, h.Keys)
	case h.Lanes > 0 && (h.Exchange != "" || h.Reply):
		return fmt.Errorf("router: handler %s: HandlerConfig.Lanes %d is set with Exchange or Reply: an ordered queue's messages "+
			"come from publishers that route them to its lanes by key", h.Name, h.Lanes)
	}
	if err := (topology.Topology{Queues: []topology.Queue{{Name: h.Queue, Lanes: h.Lanes}}}).Validate(); err != nil {
		return fmt.Errorf("router: handler %s: HandlerConfig.Queue: %w", h.Name, err)
	}
	if h.Lanes > 0 && len(LeaseQueue(h.Queue, h.Lanes-1)) > 255 {
		return fmt.Errorf("router: handler %s: HandlerConfig.Queue is %d bytes long: with its lanes' leases' suffix it exceeds 255",
			h.Name, len(h.Queue))
	}
	if err := validConcurrency("HandlerConfig.Concurrency", h.Concurrency); err != nil {
		return fmt.Errorf("router: handler %s: %w", h.Name, err)
	}
	if h.Retry != nil {
		if err := validRetry("HandlerConfig.Retry", *h.Retry); err != nil {
			return fmt.Errorf("router: handler %s: %w", h.Name, err)
		}
	}
	return nil
}

// AddHandler registers fn on h.Queue; the messages fn returns are published to
// h.PublishTopic.
func (r *Router) AddHandler(h HandlerConfig, fn message.HandlerFunc) error {
	if h.Name == "" {
		h.Name = h.Queue
	}
	if err := h.validate(); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("router: AddHandler after Close: router is %w", warren.ErrClosed)
	}
	if r.names[h.Name] {
		return fmt.Errorf("router: a handler named %q exists already", h.Name)
	}
	q := r.queue(h.Queue)
	if q.Lanes != h.Lanes {
		// Lanes the handler would not consume, or that the router's publisher would not route
		// to: refused, rather than messages left unread or out of order.
		return fmt.Errorf("router: handler %s: HandlerConfig.Lanes %d: Config.Declare lists queue %q with Lanes %d, "+
			"the same number is needed in both (docs/ordering.md)", h.Name, h.Lanes, h.Queue, q.Lanes)
	}
	chain, err := r.chain(h)
	if err != nil {
		return fmt.Errorf("router: handler %s: %w", h.Name, err)
	}
	concurrency := h.Concurrency
	if concurrency == 0 {
		concurrency = r.cfg.Concurrency
	}
	scfg := r.cfg.subscriber()
	scfg.Concurrency, scfg.HandlerName, scfg.GoOnAfterPoison = concurrency, h.Name, h.GoOnAfterPoison
	if q.Lanes > 0 { // the subscriber knows the lanes from its queue's declaration
		scfg.Queues = append(slices.DeleteFunc(slices.Clone(scfg.Queues), func(l topology.Queue) bool { return l.Name == q.Name }), q)
	}
	sub, err := consumer.NewSubscriberOn(r.subConns, scfg, r.logger)
	if err != nil {
		return fmt.Errorf("router: handler %s: %w", h.Name, err)
	}
	// The chain publishes what fn returns; Watermill's handler gets nothing to publish.
	handle := fn
	for i := len(chain) - 1; i >= 0; i-- {
		handle = chain[i](handle)
	}
	var wsub message.Subscriber = sub
	if q.Lanes > 0 {
		wsub = lanes{Subscriber: sub, n: q.Lanes, dialer: amqpx.NewDialer(r.cfg.Connection, "warren lanes "+h.Name, r.logger), logger: r.logger}
	}
	r.wm.AddConsumerHandler(h.Name, h.Queue, wsub, settling(handle))

	r.names[h.Name] = true
	r.subs = append(r.subs, sub)
	r.topo.Queues = append(r.topo.Queues, q)
	if h.Exchange != "" {
		r.topo.Exchanges = append(r.topo.Exchanges, r.exchange(h.Exchange))
		for _, key := range h.Keys {
			r.topo.Bindings = append(r.topo.Bindings, topology.Binding{Exchange: h.Exchange, Queue: h.Queue, Key: key})
		}
	}
	return nil
}

// AddConsumerHandler registers fn, which publishes nothing, on h.Queue.
func (r *Router) AddConsumerHandler(h HandlerConfig, fn message.NoPublishHandlerFunc) error {
	return r.AddHandler(h, func(msg *message.Message) ([]*message.Message, error) {
		return nil, fn(msg)
	})
}

// queue is the declaration of queue: as listed in Config.Declare, or with the defaults.
func (r *Router) queue(name string) topology.Queue {
	for _, q := range r.cfg.Declare.Queues {
		if q.Name == name {
			return q
		}
	}
	return topology.Queue{Name: name}
}

func (r *Router) exchange(name string) topology.Exchange {
	for _, e := range r.cfg.Declare.Exchanges {
		if e.Name == name {
			return e
		}
	}
	return topology.Exchange{Name: name}
}

// settling runs handle on a message of a handler's Subscriber and settles it (see
// consumer.NewSubscriberOn): acked when handle succeeded, nacked when it failed or panicked
// (the panic goes on to Watermill's handler), unless the chain acked or nacked it already, as
// Watermill's handler would.
func settling(handle message.HandlerFunc) message.NoPublishHandlerFunc {
	return func(msg *message.Message) (err error) {
		growStack()
		ctx := msg.Context() // the subscriber's: the chain may give msg a context of its own
		returned := false
		defer func() {
			acked := returned && err == nil && msg.Ack()
			if !acked {
				acked = !msg.Nack() // false when acked before
			}
			contract.Settle(ctx, acked)
		}()
		_, err = handle(msg)
		returned = true
		return err
	}
}

// growStack grows the stack of the goroutine that calls it to 16 KB while it is shallow.
// Watermill's router handles every message on a goroutine of its own, which starts on 2 KB;
// the default chain needs more (and a handler that replies or publishes, more again), and a
// stack that grows deep in the chain has every frame on it copied and adjusted, once for every
// doubling (about 10,000 instructions a message, 50,000 for an rpc reply, see
// docs/decisions.md): grown here, only the two frames below this one are, once.
//
//go:noinline
func growStack() byte {
	var frame [12 << 10]byte
	return frame[stackProbe]
}

// stackProbe is 0: read, not known to the compiler, so that growStack's frame is kept.
var stackProbe = 0
