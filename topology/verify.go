package topology

import (
	"context"
	"errors"
	"fmt"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
)

// Report is the result of Verify.
type Report struct {
	// Missing lists the exchanges and queues that do not exist, as `queue "name"`.
	Missing []string
	// Differs lists those that exist with other arguments.
	Differs []*MismatchError
	// Unchecked lists the bindings: AMQP 0-9-1 cannot tell whether a binding exists.
	Unchecked []string
	// Unresolved lists the names that bindings use which the topology does not declare and
	// the broker does not have, each naming its binding: Apply would refuse the topology.
	Unresolved []string
	// DeadLettering says what is wrong with the broker's dead-lettering, which the delay
	// levels rest on (see Builder.ProbeDeadLettering); "" when it works, or when the delay
	// levels are disabled.
	DeadLettering string
	// Lanes lists the ordered queues whose lanes on the broker are not the topology's and
	// hold messages or consumers: Apply would refuse them (see Queue.Lanes).
	Lanes []string
}

// OK reports whether nothing is missing, nothing differs, no binding is unresolved, the
// broker dead-letters and no ordered queue's lanes changed while in use.
func (r Report) OK() bool {
	return len(r.Missing) == 0 && len(r.Differs) == 0 && len(r.Unresolved) == 0 && r.DeadLettering == "" && len(r.Lanes) == 0
}

// String lists what is missing and what differs, one per line.
func (r Report) String() string {
	var sb strings.Builder
	for _, m := range r.Missing {
		fmt.Fprintf(&sb, "missing: %s\n", m)
	}
	for _, d := range r.Differs {
		fmt.Fprintf(&sb, "differs: %s %q: %s%s (%v)\n", d.What, d.Name, d.Argument, d.detail(), d.Err)
	}
	for _, u := range r.Unresolved {
		fmt.Fprintf(&sb, "unresolved: %s\n", u)
	}
	if r.DeadLettering != "" {
		fmt.Fprintf(&sb, "dead-lettering: %s\n", r.DeadLettering)
	}
	for _, l := range r.Lanes {
		fmt.Fprintf(&sb, "lanes: %s\n", l)
	}
	if r.OK() {
		sb.WriteString("ok\n")
	}
	return sb.String()
}

// Verify declares nothing of t: it reports which exchanges and queues of t (and of the delay
// levels, unless disabled) are missing, and which exist with other arguments. Unless the
// delay levels are disabled, it also checks that the broker dead-letters as they need (with a
// probe queue of its own that it deletes; see probeDeadLettering). It connects as conn says,
// as Apply does, retrying a lost connection until the longer of conn.ConnectTimeout and
// Config.Timeout.
//
// AMQP 0-9-1 has no way to read an exchange's or queue's arguments, so Verify first checks
// existence with a passive declare and then declares the existing object again with the
// arguments warren would use: the broker accepts that without change when they are equal
// and refuses it, naming the argument, when they are not. (Only if the object is deleted
// between the two calls does the second one create it.)
func (b *Builder) Verify(ctx context.Context, conn warren.Connection, t Topology) (Report, error) {
	if err := conn.Validate(); err != nil {
		return Report{}, fmt.Errorf("topology: verify: %w", err)
	}
	if err := t.ValidateWith(b.cfg); err != nil {
		return Report{}, err
	}
	conn = conn.WithDefaults()
	var r Report
	// A broker that cannot dead-letter closes the connection when the probe is declared:
	// that is in the Report, not an error to log.
	err := amqpx.NewDialer(conn, "warren topology", b.logger).OwnerReportsLoss().Run(ctx, max(conn.ConnectTimeout, b.cfg.Timeout), "topology: verify",
		func(ctx context.Context, conn *amqp.Connection) (err error) {
			r, err = b.verify(ctx, conn, t)
			return err
		})
	return r, err
}

// verify is Verify on conn.
func (b *Builder) verify(ctx context.Context, conn *amqp.Connection, t Topology) (Report, error) {
	if err := t.ValidateFor(b.cfg, amqpx.ServerVersion(conn)); err != nil {
		return Report{}, amqpx.GiveUp(err)
	}
	var r Report
	objs := append(b.delayObjects(), b.objects(t)...)
	var ch *amqp.Channel
	defer func() {
		if ch != nil {
			_ = ch.Close()
		}
	}()
	for _, o := range objs {
		if o.what == "binding" {
			r.Unchecked = append(r.Unchecked, o.name)
			continue
		}
		// A failed declare closes the channel: open a fresh one whenever needed.
		var err error
		if ch == nil || ch.IsClosed() {
			if ch, err = conn.Channel(); err != nil {
				return r, fmt.Errorf("topology: verify: open channel: %w", err)
			}
		}
		exists, err := b.passive(ctx, ch, o)
		if err != nil {
			return r, err
		}
		if !exists {
			r.Missing = append(r.Missing, fmt.Sprintf("%s %q", o.what, o.name))
			continue
		}
		if ch.IsClosed() {
			if ch, err = conn.Channel(); err != nil {
				return r, fmt.Errorf("topology: verify: open channel: %w", err)
			}
		}
		err = b.declareOne(ctx, ch, o)
		var m *MismatchError
		switch {
		case errors.As(err, &m):
			r.Differs = append(r.Differs, m)
		case err != nil:
			return r, err
		}
	}
	var err error
	if r.Lanes, _, err = b.laneChanges(ctx, conn, t); err != nil {
		return r, err
	}
	if r.Unresolved, err = b.unresolved(ctx, conn, t); err != nil || b.cfg.Delay.Disabled {
		return r, err
	}
	r.DeadLettering, err = b.probeDeadLettering(ctx, conn)
	return r, err
}

// passive reports whether o exists. A queue that is exclusive to another connection exists.
func (b *Builder) passive(ctx context.Context, ch *amqp.Channel, o object) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	err := amqpx.Do(ctx, ch, func() error {
		if o.what == "exchange" {
			return ch.ExchangeDeclarePassive(o.name, string(o.kind), true, false, o.internal, false, nil)
		}
		_, err := ch.QueueDeclarePassive(o.name, true, false, false, false, nil)
		return err
	})
	var ae *amqp.Error
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &ae) && ae.Code == amqp.NotFound:
		return false, nil
	case errors.As(err, &ae) && (ae.Code == amqp.ResourceLocked || ae.Code == amqp.PreconditionFailed):
		return true, nil
	}
	return false, fmt.Errorf("topology: verify %s %q: %w", o.what, o.name, err)
}
