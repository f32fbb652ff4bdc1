package consumer

import (
	"context"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/contract"
)

// message unmarshals d and readies it to be handed out: its context carries the handout (see
// contract.Handling) and ends once the message is settled, or when the subscriber has closed.
// A delivery that cannot be unmarshaled, or whose headers the client could not read, goes to
// the poison queue and nil is returned.
func (sub *subscription) message(d amqp.Delivery, id string, cs *channelState) *handout {
	viaDelay := strings.HasPrefix(d.Exchange, sub.s.viaDelay)
	info := contract.Delivery{Queue: sub.queue, Exchange: d.Exchange, RoutingKey: d.RoutingKey, Redelivered: d.Redelivered}
	info.PublishID = id
	if viaDelay { // its destination: an exchange, or the queue through the default exchange
		info.Exchange, _ = d.Headers[contract.DestExchangeHeader].(string)
	}
	var (
		msg *message.Message
		err error
	)
	if why, unreadable := d.Headers[contract.UnreadableHeader].(string); unreadable {
		err = &unreadableError{why}
	} else {
		msg, err = sub.s.cfg.Marshaler.Unmarshal(d)
	}
	if err != nil {
		sub.poisonUndecodable(d, info, err, cs)
		return nil
	}
	// warren's bookkeeping is believed only where warren put it: see Subscriber.
	direct := (d.Exchange == "" && d.RoutingKey == sub.consumed) ||
		(viaDelay && d.Headers[contract.DestQueueHeader] == sub.consumed)
	retry := direct && msg.Metadata.Get(warren.RetryQueueKey) == sub.consumed
	for k := range msg.Metadata {
		if k == warren.MetadataRedelivered || !retry && warren.IsAttemptBookkeeping(k) ||
			!direct && warren.IsPoisonBookkeeping(k) {
			delete(msg.Metadata, k)
		}
	}
	h := &handout{sub: sub, cs: cs, msg: msg, tag: d.DeliveryTag, id: id}
	if sub.ordered {
		h.key, _ = d.Headers[warren.MetadataOrderKey].(string)
		h.raw = new(amqp.Delivery) // a copy of its own: &d would move d to the heap on every path
		*h.raw = d
		_, h.marked = d.Headers[contract.ReleasedHeader]
		if h.key != "" && !sub.s.cfg.GoOnAfterPoison {
			h.Holder = h
		}
	}
	h.Delivery, h.DeadLetters, h.Stopping = info, true, cs.stopping
	if sub.s.callerSettles {
		h.Settler = h
	}
	var ctx context.Context
	ctx, h.done = context.WithCancel(contract.WithHandling(cs.hardStop, &h.Handling))
	msg.SetContext(ctx)
	if d.Redelivered {
		msg.Metadata.Set(warren.MetadataRedelivered, "true")
	}
	return h
}

// recordLateness records how late a delivery that came through the delay levels arrived
// after the time it was due (contract.DueHeader).
func (sub *subscription) recordLateness(d amqp.Delivery) {
	if due, ok := d.Headers[contract.DueHeader].(int64); ok && strings.HasPrefix(d.Exchange, sub.s.viaDelay) {
		sub.s.metrics.Late(context.Background(), sub.lateness, time.UnixMicro(due), time.Now())
	}
}
