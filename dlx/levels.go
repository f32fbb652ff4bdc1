package dlx

import (
	"fmt"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/topology"
)

// prepare returns where o is published now, and how: to its destination, or with the
// digits of its remaining delay to the delay levels.
func (p *Publisher) prepare(route Route, o outgoing) (exchange, key string, pub amqp.Publishing, err error) {
	exchange, key, pub = route.Exchange, route.RoutingKey, o.pub
	if o.lane != "" {
		key = o.lane
	}
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
	pub.Headers[contract.DueHeader] = o.due.UnixMicro() // for the consumer's warren.delay.lateness
	levelSafe(&pub)
	if route.Exchange == "" {
		pub.Headers[contract.DestQueueHeader] = key
	} else {
		pub.Headers[contract.DestExchangeHeader] = route.Exchange
	}
	return plan.Exchange, key, pub, nil
}

// fits checks that pub, with the delay plan's headers and the destination header that
// publishAll adds (lane, when not ""), is within amqpx.MaxHeaderFrame.
func fits(pub amqp.Publishing, plan topology.Plan, route Route, lane string) error {
	if lane != "" {
		route.RoutingKey = lane
	}
	size, err := amqpx.HeaderFrameSize(pub)
	if err != nil {
		return err
	}
	if plan.Exchange != "" {
		extra := amqp.Table{contract.DestQueueHeader: route.RoutingKey, contract.DestExchangeHeader: route.Exchange,
			contract.DueHeader: int64(0)}
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
		return fmt.Errorf("%w: %d bytes, the limit is %d", warren.ErrTooLarge, size, amqpx.MaxHeaderFrame)
	}
	return nil
}

// levelSafe moves the properties that would break the delay levels into headers of their
// metadata keys, which warren.Marshaler reads back: the expiration (a per-message TTL would cut
// the wait in a level queue short; the broker removes it on dead-lettering anyway) and the
// priority (quorum queues of RabbitMQ 4.0 take high-priority messages first, and a level
// queue then expires the messages behind one only with it, late; see docs/decisions.md, "A
// delayed message's expiration and priority"). The destination therefore gets a delayed
// message without these properties, and its metadata with them.
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
