package router

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
)

// KillState returns the kill command remembered for the consumers of queue: the newest
// valid command of its kill state queue (KillStateQueue, named with secret), and whether
// there is one (none when the queue was never killed, or its state queue is gone). It reads
// under the state's lock, as consumers and Killers do, and puts every command back as it
// found it. A Resume command means the queue is not killed.
func KillState(ctx context.Context, conn *amqp.Connection, queue string, secret []byte) (Command, bool, error) {
	name := KillStateQueue(queue, secret)
	unlock, err := lockState(ctx, conn, queue)
	if err != nil {
		return Command{}, false, err
	}
	defer unlock()
	var newest Command
	found := false
	err = onChannel(conn, func(ch *amqp.Channel) error {
		ds, err := getAll(ctx, ch, name, stateReadMax)
		if len(ds) > 0 {
			last := ds[len(ds)-1].DeliveryTag
			defer func() { _ = ch.Nack(last, true, true) }()
		}
		if err != nil {
			return err
		}
		for _, d := range ds {
			var c Command
			if json.Unmarshal(d.Body, &c) != nil ||
				c.verify(queue, secret, time.Now(), 0, time.Duration(math.MaxInt64)) != nil {
				continue // consumers refuse it too
			}
			if !found || c.At.After(newest.At) {
				newest, found = c, true
			}
		}
		return nil
	})
	if amqpx.IsNotFound(err) {
		return Command{}, false, nil
	}
	if err != nil {
		return Command{}, false, fmt.Errorf("router: kill state of %s: %w", queue, err)
	}
	return newest, found, nil
}
