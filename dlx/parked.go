package dlx

import (
	"context"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
)

// Parked returns how many delayed messages wait in the parking queue because their
// destination did not exist when they arrived. The queue's name is
// topology.Delay.ParkingQueue(); its messages keep their headers, including the
// destination (contract.DestExchangeHeader or contract.DestQueueHeader).
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
