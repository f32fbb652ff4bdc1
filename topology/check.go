package topology

import (
	"context"
	"fmt"
	"slices"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
)

// ValidateWith is Validate, and then reports the first entry of t that, declared with c,
// would not be what it says: a field or argument that warren or the broker would ignore,
// or that the broker would refuse for the queue's type. It names the entry and the field.
//
//   - Queue.DeliveryLimit on a classic queue: a classic queue has no delivery limit.
//   - Queue.Args that warren sets itself (x-queue-type, x-delivery-limit, the dead-letter
//     arguments, and on a quorum queue x-dead-letter-strategy and x-overflow): Queue.Type,
//     Queue.DeliveryLimit and the poison queue say them.
//   - Queue.Args of the other queue type, as measured on RabbitMQ 3.10.8 and 4.0.5: a
//     classic queue refuses x-dead-letter-strategy, x-quorum-initial-group-size and
//     x-max-in-memory-length/-bytes and ignores x-quorum-target-group-size; a quorum queue
//     refuses x-queue-mode, x-queue-master-locator and x-queue-version.
//
// What depends on the broker's version (x-max-priority on a quorum queue, x-consumer-timeout)
// is checked by ValidateFor, when the version is known. Builder checks ValidateWith before it
// declares anything, and ValidateFor too when it knows the version (Builder.ForServer).
func (t Topology) ValidateWith(c Config) error {
	return t.validateFor(c, "")
}

// ValidateFor is ValidateWith for a broker of RabbitMQ version (as the connection that
// declares announced it, see Builder.ForServer; "" when unknown), and then reports the first
// queue argument that this version refuses or ignores for the queue's type:
//
//   - x-max-priority on a quorum queue: refused by every version up to 4.3 (measured on
//     3.10.8 and 4.0.5; RabbitMQ 4.3.5's source lists it for classic queues only). Quorum
//     queues order messages by their priority property without it from 4.0: two levels up
//     to 4.2 (a priority above 4 goes first), 32 levels (0–31) from 4.3. A later version,
//     or an unknown one, is left to decide (a refusal is then reported by the declaration).
//   - x-consumer-timeout: ignored before 3.12, which has only the node's consumer_timeout
//     (measured on 3.10.8); from 4.3 refused on a classic queue, whose consumers no longer
//     time out (4.3's release notes and source).
func (t Topology) ValidateFor(c Config, version string) error {
	return t.validateFor(c, version)
}

func (t Topology) validateFor(c Config, version string) error {
	if err := t.Validate(); err != nil {
		return err
	}
	c = c.WithDefaults()
	for i, q := range t.Queues {
		typ := q.Type
		if typ == "" {
			typ = c.QueueType
		}
		if q.DeliveryLimit != 0 && typ == Classic {
			return fmt.Errorf("topology: Queues[%d].DeliveryLimit %d: queue %q is classic, which has no delivery limit "+
				"(it would be ignored): remove it, or make the queue quorum (Queue.Type)", i, q.DeliveryLimit, q.Name)
		}
		keys := make([]string, 0, len(q.Args))
		for k := range q.Args {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			why := argProblem(k, typ)
			if why == "" {
				why = versionArgProblem(k, typ, version)
			}
			if why != "" {
				return fmt.Errorf("topology: Queues[%d].Args[%q] of %s queue %q: %s", i, k, typ, q.Name, why)
			}
		}
	}
	return nil
}

// argProblem says why queue argument k does not belong in Queue.Args of a queue of type
// typ, or "" if it does.
func argProblem(k string, typ QueueType) string {
	switch k {
	case amqp.QueueTypeArg:
		return "warren sets it from Queue.Type (or Config.QueueType): give the type there"
	case "x-dead-letter-exchange", "x-dead-letter-routing-key":
		return "warren sets it: a work queue dead-letters into its poison queue"
	}
	if typ == Quorum {
		switch k {
		case "x-delivery-limit":
			return "warren sets it from Queue.DeliveryLimit (or Config.DeliveryLimit): give the limit there"
		case "x-dead-letter-strategy", amqp.QueueOverflowArg:
			return "warren sets it: dead-lettering into the poison queue is at-least-once, which needs x-overflow reject-publish"
		case "x-queue-mode", "x-queue-master-locator", "x-queue-version":
			return "a classic queue's argument, which RabbitMQ refuses on a quorum queue"
		}
		return ""
	}
	switch k {
	case "x-delivery-limit", "x-dead-letter-strategy", "x-quorum-initial-group-size", "x-max-in-memory-length", "x-max-in-memory-bytes":
		return "a quorum queue's argument, which RabbitMQ refuses on a classic queue"
	case "x-quorum-target-group-size":
		return "a quorum queue's argument, which RabbitMQ ignores on a classic queue"
	}
	return ""
}

// versionArgProblem says why queue argument k does not belong on a queue of type typ
// declared on RabbitMQ version (see ValidateFor for the rules), or "" if it does, or if the
// rule does not know the version (then the broker decides).
func versionArgProblem(k string, typ QueueType, version string) string {
	major, minor, ok := amqpx.MajorMinor(version)
	if !ok {
		return ""
	}
	before := func(ma, mi int) bool { return major < ma || major == ma && minor < mi }
	switch {
	case k == "x-max-priority" && typ == Quorum && before(4, 0):
		return "RabbitMQ " + version + " refuses it on a quorum queue, whose messages have no priority before 4.0: " +
			"make the queue classic (Queue.Type), or use a queue per priority"
	case k == "x-max-priority" && typ == Quorum && before(4, 3):
		return "RabbitMQ " + version + " refuses it on a quorum queue, which orders messages by their priority without it " +
			"(two levels: a priority above 4 goes first): remove it"
	case k == "x-max-priority" && typ == Quorum && before(4, 4):
		return "RabbitMQ " + version + " refuses it on a quorum queue, which orders messages by their priority without it " +
			"(32 levels, 0–31; a message without one counts as 4): remove it"
	case k == "x-consumer-timeout" && before(3, 12):
		return "RabbitMQ " + version + " ignores it: a consumer timeout per queue needs RabbitMQ 3.12; " +
			"this version has only the node's consumer_timeout (rabbitmq.conf, 30 minutes by default)"
	case k == "x-consumer-timeout" && typ == Classic && !before(4, 3):
		return "RabbitMQ " + version + " refuses it on a classic queue: from 4.3 only quorum queues have a consumer timeout"
	}
	return ""
}

// reference is a name that a binding of a Topology uses and the Topology does not declare.
type reference struct {
	field string // "Bindings[2].Queue"
	what  string // "exchange" or "queue"
	name  string
}

// references lists the names that t's bindings use and that declaring t does not declare:
// neither t itself nor what declaring it adds (poison queues, kill exchanges, the delay
// levels). They must exist on the broker.
func (b *Builder) references(t Topology) []reference {
	declared := map[string]bool{}
	for _, o := range append(b.delayObjects(), b.objects(t)...) {
		if o.what != "binding" {
			declared[o.what+" "+o.name] = true
		}
	}
	var refs []reference
	add := func(field, what, name string) {
		if name != "" && !declared[what+" "+name] {
			refs = append(refs, reference{field, what, name})
		}
	}
	for i, bd := range t.Bindings {
		add(fmt.Sprintf("Bindings[%d].Exchange", i), "exchange", bd.Exchange)
		add(fmt.Sprintf("Bindings[%d].Queue", i), "queue", bd.Queue)
		add(fmt.Sprintf("Bindings[%d].ToExchange", i), "exchange", bd.ToExchange)
	}
	return refs
}

// unresolved checks on the broker the names t's bindings use without declaring them (see
// references), declaring nothing, and describes each that does not exist.
func (b *Builder) unresolved(ctx context.Context, conn *amqp.Connection, t Topology) ([]string, error) {
	var (
		ch      *amqp.Channel
		missing []string
	)
	defer func() {
		if ch != nil {
			_ = ch.Close()
		}
	}()
	for _, r := range b.references(t) {
		if ch == nil || ch.IsClosed() { // a passive declare of a missing name closes the channel
			var err error
			if ch, err = conn.Channel(); err != nil {
				return nil, fmt.Errorf("topology: open channel: %w", err)
			}
		}
		exists, err := b.passive(ctx, ch, object{what: r.what, name: r.name})
		if err != nil {
			return nil, err
		}
		if !exists {
			missing = append(missing, fmt.Sprintf("%s: %s %q is declared neither by the topology nor on the broker", r.field, r.what, r.name))
		}
	}
	return missing, nil
}
