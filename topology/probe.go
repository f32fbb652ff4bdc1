package topology

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
)

// probeWait bounds how long probeDeadLettering waits for its message: on a working broker it
// comes in milliseconds.
const probeWait = 10 * time.Second

// probeDeadLettering checks that the broker dead-letters out of a queue declared as the delay
// levels are (their queue type; for quorum, at-least-once dead-lettering): it declares a
// probe queue of that kind, with a 1 ms TTL and its own name (NAME.probe.ID, where NAME is
// the delay levels' name; x-expires removes one left behind), publishes one message to it
// and waits up to 10 s for the message to be dead-lettered into an exclusive queue of the
// connection. The probe queue is deleted afterwards.
//
// It returns "" when the message came, else what went wrong: the broker refused to declare
// the probe queue (RabbitMQ 3.10 to 3.13 once a malformed x-death has stopped the node's
// dead-letter worker: 541, the queue left down), or the message was not dead-lettered in
// time. These are the node's state, which AMQP cannot otherwise see: the level queues that
// exist keep running while their messages stay in them. An error is returned only for a
// failure of the check itself (a lost connection, say).
func (b *Builder) probeDeadLettering(ctx context.Context, conn *amqp.Connection) (string, error) {
	d := b.cfg.Delay
	ch, err := conn.Channel()
	if err != nil {
		return "", fmt.Errorf("topology: probe dead-lettering: %w", err)
	}
	defer func() { _ = ch.Close() }()
	var target amqp.Queue
	err = amqpx.Do(ctx, ch, func() (err error) {
		target, err = ch.QueueDeclare("", false, true, true, false, nil)
		return err
	})
	if err != nil {
		return "", fmt.Errorf("topology: probe dead-lettering: declare its target: %w", err)
	}
	probe := d.Name() + ".probe." + watermill.NewShortUUID()
	args := d.levelArgs(1, "")
	args["x-dead-letter-routing-key"] = target.Name
	args[amqp.QueueTTLArg] = int32(time.Minute / time.Millisecond)
	err = amqpx.Do(ctx, ch, func() error {
		_, err := ch.QueueDeclare(probe, true, false, false, false, args)
		return err
	})
	var ae *amqp.Error
	switch {
	case errors.As(err, &ae) && ae.Code == amqp.InternalError:
		b.deleteProbe(ctx, conn, probe) // the broker left it down
		return fmt.Sprintf("the broker refused a %s queue that dead-letters as the delay levels do (%v): "+
			"dead-lettering is broken on this node, delayed messages stay in their levels; see docs/dead-lettering.md",
			d.QueueType, ae), nil
	case err != nil:
		return "", fmt.Errorf("topology: probe dead-lettering: declare %q: %w", probe, err)
	}
	defer b.deleteProbe(ctx, conn, probe)

	deliveries, err := ch.ConsumeWithContext(ctx, target.Name, "", true, true, false, false, nil)
	if err != nil {
		return "", fmt.Errorf("topology: probe dead-lettering: consume: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return "", fmt.Errorf("topology: probe dead-lettering: %w", err)
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", probe, true, false, amqp.Publishing{Body: []byte("probe")})
	if err != nil {
		return "", fmt.Errorf("topology: probe dead-lettering: publish: %w", err)
	}
	if ok, err := dc.WaitContext(ctx); err != nil || !ok {
		return fmt.Sprintf("the probe queue %q did not take a message (nacked: %v)", probe, err), nil
	}
	timer := time.NewTimer(probeWait)
	defer timer.Stop()
	select {
	case _, ok := <-deliveries:
		if !ok {
			return "", errors.New("topology: probe dead-lettering: its channel closed")
		}
		return "", nil
	case <-timer.C:
		return fmt.Sprintf("a message that expired in the probe queue %q was not dead-lettered within %s: "+
			"dead-lettering is stuck on this node, delayed messages stay in their levels; see docs/dead-lettering.md",
			probe, probeWait), nil
	case <-ctx.Done():
		return "", fmt.Errorf("topology: probe dead-lettering: %w", context.Cause(ctx))
	}
}

// deleteProbe deletes the probe queue on a channel of its own (the probe's may be closed by a
// refusal), ignoring a failure: x-expires removes it later.
func (b *Builder) deleteProbe(ctx context.Context, conn *amqp.Connection, probe string) {
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	defer func() { _ = ch.Close() }()
	_ = amqpx.Do(ctx, ch, func() error {
		_, err := ch.QueueDelete(probe, false, false, false)
		return err
	})
}
