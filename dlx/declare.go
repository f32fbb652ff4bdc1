package dlx

import (
	"context"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/topology"
)

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
		if q.Lanes > 0 {
			p.ordered.Store(true)
		}
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
	q.Name = route.RoutingKey
	if home, lane, ok := topology.ParseLane(route.RoutingKey); ok && lane < p.queues[home].Lanes {
		q = p.queues[home] // a lane of a listed queue ordered by key: declared with its queue
	}
	p.mu.Unlock()
	err = p.withDeclareChannel(ctx, func(ch *amqp.Channel) error {
		if route.Exchange == "" {
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
