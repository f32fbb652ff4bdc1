package topology

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
)

// Builder declares topologies: the delay levels, exchanges, work queues with their poison
// queues and kill exchanges, and bindings. Declaring is idempotent. A Builder is also a
// watermill-amqp TopologyBuilder (see BuildTopology).
type Builder struct {
	cfg    Config
	logger watermill.LoggerAdapter
}

// NewBuilder returns a Builder, or an error naming the first invalid field of config.
func NewBuilder(config Config, logger watermill.LoggerAdapter) (*Builder, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	return &Builder{cfg: config.WithDefaults(), logger: logger}, nil
}

// Config returns the builder's configuration, with defaults applied.
func (b *Builder) Config() Config { return b.cfg }

// Delay returns the layout of the delay levels.
func (b *Builder) Delay() Delay { return b.cfg.Delay }

// object is one exchange, queue or binding to declare or verify.
type object struct {
	what     string // "exchange", "queue" or "binding"
	name     string
	kind     Kind // exchange
	internal bool // exchange
	args     amqp.Table
	binding  Binding
}

// Declare declares the delay levels (unless disabled) and everything in t on ch.
// Each call to the broker is bounded by ctx and Config.Timeout. An existing exchange or
// queue with other arguments gives a *MismatchError naming it and the argument.
func (b *Builder) Declare(ctx context.Context, ch *amqp.Channel, t Topology) error {
	if err := t.Validate(); err != nil {
		return err
	}
	return b.declare(ctx, ch, append(b.delayObjects(), b.objects(t)...))
}

// DeclareTopology declares everything in t, as Declare does, but not the delay levels
// (only their delivery exchange, which t's work queues and exchanges are bound from): for
// when the levels were declared already.
func (b *Builder) DeclareTopology(ctx context.Context, ch *amqp.Channel, t Topology) error {
	if err := t.Validate(); err != nil {
		return err
	}
	return b.declare(ctx, ch, append(b.deliveryObjects(), b.objects(t)...))
}

// DeclareQueue declares work queue q, its poison queue and kill exchange, and its binding
// from the delivery exchange.
func (b *Builder) DeclareQueue(ctx context.Context, ch *amqp.Channel, q Queue) error {
	return b.DeclareTopology(ctx, ch, Topology{Queues: []Queue{q}})
}

// DeclareExchange declares exchange e and its binding from the delivery exchange.
func (b *Builder) DeclareExchange(ctx context.Context, ch *amqp.Channel, e Exchange) error {
	return b.DeclareTopology(ctx, ch, Topology{Exchanges: []Exchange{e}})
}

// objects expands t into what declaring it takes: exchanges, work queues (with theirs),
// bindings; the delay levels apart.
func (b *Builder) objects(t Topology) []object {
	var objs []object
	for _, e := range t.Exchanges {
		objs = append(objs, b.exchangeObjects(e)...)
	}
	for _, q := range t.Queues {
		objs = append(objs, b.queueObjects(q)...)
	}
	for _, bd := range t.Bindings {
		objs = append(objs, object{what: "binding", name: bd.String(), binding: bd})
	}
	return objs
}

// Apply dials url and declares t (and the delay levels), retrying transient failures with
// backoff until Config.Timeout.
func (b *Builder) Apply(ctx context.Context, url string, t Topology) error {
	return amqpx.Retry(ctx, b.cfg.Timeout, "topology: apply", func(ctx context.Context) error {
		conn, err := amqpx.Dial(url, "warren topology", b.cfg.Timeout)
		if err != nil {
			return err
		}
		defer conn.Close()
		ch, err := conn.Channel()
		if err != nil {
			return err
		}
		return amqpx.PermanentIfRefused(b.Declare(ctx, ch, t))
	})
}

func (b *Builder) declare(ctx context.Context, ch *amqp.Channel, objs []object) error {
	for _, o := range objs {
		if err := b.declareOne(ctx, ch, o); err != nil {
			return err
		}
	}
	return nil
}

func (b *Builder) declareOne(ctx context.Context, ch *amqp.Channel, o object) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	err := amqpx.Do(ctx, ch, func() error {
		switch o.what {
		case "exchange":
			return ch.ExchangeDeclare(o.name, string(o.kind), true, false, o.internal, false, o.args)
		case "queue":
			_, err := ch.QueueDeclare(o.name, true, false, false, false, o.args)
			return err
		default:
			bd := o.binding
			if bd.ToExchange != "" {
				return ch.ExchangeBind(bd.ToExchange, bd.Key, bd.Exchange, false, bd.args())
			}
			return ch.QueueBind(bd.Queue, bd.Key, bd.Exchange, false, bd.args())
		}
	})
	if err != nil {
		return declareError(o.what, o.name, err)
	}
	return nil
}

// deliveryObjects are the delivery exchange and the parking queue behind it: what a work
// queue or exchange needs in order to be bound as a destination of delayed messages.
func (b *Builder) deliveryObjects() []object {
	d := b.cfg.Delay
	if d.Disabled {
		return nil
	}
	return []object{
		{what: "exchange", name: d.ParkingExchange(), kind: Fanout},
		{what: "queue", name: d.ParkingQueue(), args: d.queueArgs()},
		{what: "binding", name: "parking", binding: Binding{Exchange: d.ParkingExchange(), Queue: d.ParkingQueue()}},
		{what: "exchange", name: d.DeliveryExchange(), kind: Headers, args: amqp.Table{"alternate-exchange": d.ParkingExchange()}},
	}
}

// delayObjects are all of the delay levels.
func (b *Builder) delayObjects() []object {
	d := b.cfg.Delay
	if d.Disabled {
		return nil
	}
	levelArgs := func(ttl int64, next string) amqp.Table {
		args := d.queueArgs()
		args[amqp.QueueMessageTTLArg] = ttl
		args["x-dead-letter-exchange"] = next
		if d.QueueType == Quorum {
			args["x-dead-letter-strategy"] = "at-least-once"
			args[amqp.QueueOverflowArg] = amqp.QueueOverflowRejectPublish
		}
		return args
	}
	objs := b.deliveryObjects()
	for p := 0; p < d.Levels; p++ {
		objs = append(objs, object{what: "exchange", name: d.LevelExchange(p), kind: Headers})
	}
	for p := 0; p < d.Levels; p++ {
		zero := Binding{Exchange: d.LevelExchange(p), ToExchange: d.next(p), Headers: map[string]string{DigitHeader(p): "0"}}
		objs = append(objs, object{what: "binding", name: zero.String(), binding: zero})
		for digit := 1; digit < d.Radix; digit++ {
			q := d.LevelQueue(p, digit)
			objs = append(objs, object{what: "queue", name: q, args: levelArgs(d.TTL(p, digit).Milliseconds(), d.next(p))})
			bd := Binding{Exchange: d.LevelExchange(p), Queue: q, Headers: map[string]string{DigitHeader(p): fmt.Sprint(digit)}}
			objs = append(objs, object{what: "binding", name: bd.String(), binding: bd})
		}
	}
	return objs
}

func (b *Builder) exchangeObjects(e Exchange) []object {
	args := amqp.Table{}
	for k, v := range e.Args {
		args[k] = v
	}
	if e.AlternateExchange != "" {
		args["alternate-exchange"] = e.AlternateExchange
	}
	kind := e.Kind
	if kind == "" {
		kind = b.cfg.ExchangeKind
	}
	objs := []object{{what: "exchange", name: e.Name, kind: kind, internal: e.Internal, args: args}}
	if !b.cfg.Delay.Disabled {
		bd := Binding{Exchange: b.cfg.Delay.DeliveryExchange(), ToExchange: e.Name, Headers: map[string]string{HeaderDestExchange: e.Name}}
		objs = append(objs, object{what: "binding", name: bd.String(), binding: bd})
	}
	return objs
}

// QueueArgs are the arguments warren declares work queue q with.
func (b *Builder) QueueArgs(q Queue) amqp.Table {
	typ, limit := q.Type, q.DeliveryLimit
	if typ == "" {
		typ = b.cfg.QueueType
	}
	if limit == 0 {
		limit = b.cfg.DeliveryLimit
	}
	args := amqp.Table{}
	for k, v := range q.Args {
		args[k] = v
	}
	args["x-dead-letter-exchange"] = ""
	args["x-dead-letter-routing-key"] = PoisonQueue(q.Name)
	if typ == Quorum {
		args[amqp.QueueTypeArg] = amqp.QueueTypeQuorum
		args["x-delivery-limit"] = int64(limit)
		args["x-dead-letter-strategy"] = "at-least-once"
		args[amqp.QueueOverflowArg] = amqp.QueueOverflowRejectPublish
	}
	return args
}

func (b *Builder) queueObjects(q Queue) []object {
	typ := q.Type
	if typ == "" {
		typ = b.cfg.QueueType
	}
	poisonArgs := amqp.Table{}
	if typ == Quorum {
		limit := q.DeliveryLimit
		if limit == 0 {
			limit = b.cfg.DeliveryLimit
		}
		poisonArgs[amqp.QueueTypeArg] = amqp.QueueTypeQuorum
		poisonArgs["x-delivery-limit"] = int64(limit)
	}
	objs := []object{
		{what: "queue", name: PoisonQueue(q.Name), args: poisonArgs},
		{what: "queue", name: q.Name, args: b.QueueArgs(q)},
		{what: "exchange", name: KillExchange(q.Name), kind: Fanout},
	}
	if !b.cfg.Delay.Disabled {
		bd := Binding{Exchange: b.cfg.Delay.DeliveryExchange(), Queue: q.Name, Headers: map[string]string{HeaderDestQueue: q.Name}}
		objs = append(objs, object{what: "binding", name: bd.String(), binding: bd})
	}
	return objs
}

// MismatchError reports an exchange or queue that exists with other arguments than the ones
// warren declares it with.
type MismatchError struct {
	// What is "exchange" or "queue".
	What string
	Name string
	// Argument is the argument that differs, as the broker named it (e.g. x-queue-type).
	Argument string
	// Err is the broker's reply.
	Err error
}

// Error names the exchange or queue and the argument that differs.
func (e *MismatchError) Error() string {
	return fmt.Sprintf("topology: %s %q exists with a different %s: %v", e.What, e.Name, e.Argument, e.Err)
}

// Unwrap returns the broker's reply.
func (e *MismatchError) Unwrap() error { return e.Err }

// IsMismatch reports whether err is, or wraps, a *MismatchError.
func IsMismatch(err error) bool {
	var m *MismatchError
	return errors.As(err, &m)
}

var inequivalentArg = regexp.MustCompile(`inequivalent arg '([^']+)'`)

func declareError(what, name string, err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.PreconditionFailed {
		arg := "argument"
		if m := inequivalentArg.FindStringSubmatch(ae.Reason); m != nil {
			arg = "argument " + m[1]
		}
		return &MismatchError{What: what, Name: name, Argument: arg, Err: err}
	}
	return fmt.Errorf("topology: declare %s %q: %w", what, name, err)
}
