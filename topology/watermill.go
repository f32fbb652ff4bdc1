package topology

import (
	"context"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	amqp "github.com/rabbitmq/amqp091-go"
)

var _ wamqp.TopologyBuilder = (*Builder)(nil)

// BuildTopology implements watermill-amqp's TopologyBuilder, so a watermill-amqp Subscriber
// (and warren's) creates what it reads from: the work queue params.QueueName, with its
// poison queue, kill exchange and delivery binding, and, when params.ExchangeName is set,
// that exchange (of type config.Exchange.Type, or Config.ExchangeKind) bound to the queue
// with params.RoutingKey. config.Queue.Arguments are added to the queue's arguments; the
// queue is always durable. It declares on the channel watermill-amqp gives it, so it cannot
// retry a transient broker error (which closes that channel), such as RabbitMQ's brief
// "home node ... is down or inaccessible" while another connection creates the same durable
// queue: with many subscribers starting at once, declare the delay levels with Apply first.
func (b *Builder) BuildTopology(ch *amqp.Channel, params wamqp.BuildTopologyParams, config wamqp.Config, logger watermill.LoggerAdapter) error {
	t := Topology{Queues: []Queue{{Name: params.QueueName, Args: config.Queue.Arguments}}}
	if params.ExchangeName != "" {
		t.Exchanges = []Exchange{watermillExchange(params.ExchangeName, config)}
		t.Bindings = []Binding{{Exchange: params.ExchangeName, Queue: params.QueueName, Key: params.RoutingKey}}
	}
	return b.DeclareTopology(context.Background(), ch, t)
}

// ExchangeDeclare implements watermill-amqp's TopologyBuilder: it declares the exchange
// (of type config.Exchange.Type, or Config.ExchangeKind) and its delivery binding.
func (b *Builder) ExchangeDeclare(ch *amqp.Channel, exchangeName string, config wamqp.Config) error {
	e := watermillExchange(exchangeName, config)
	return b.DeclareExchange(context.Background(), ch, e)
}

func watermillExchange(name string, config wamqp.Config) Exchange {
	return Exchange{
		Name:     name,
		Kind:     Kind(config.Exchange.Type),
		Internal: config.Exchange.Internal,
		Args:     config.Exchange.Arguments,
	}
}
