package dlx

import (
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/ledger"
	"github.com/warrenmq/warren/topology"
)

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
