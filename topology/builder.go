package topology

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/contract"
)

// Builder declares topologies: the delay levels, exchanges, work queues with their poison
// queues and kill exchanges, and bindings. Declaring is idempotent. A Builder is also a
// watermill-amqp TopologyBuilder (see BuildTopology).
type Builder struct {
	cfg    Config
	logger watermill.LoggerAdapter
	// server is the RabbitMQ version declared on (see ForServer); "" when unknown.
	server string
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

// ForServer returns a Builder like b for declaring on a broker of RabbitMQ version, as the
// connection declared on announced it (its "version" server property,
// conn.Properties["version"]; "" when unknown): before it declares anything, it checks what
// depends on the version too (Topology.ValidateFor).
func (b *Builder) ForServer(version string) *Builder {
	c := *b
	c.server = version
	return &c
}

// object is one exchange, queue or binding to declare or verify.
type object struct {
	what     string // "exchange", "queue" or "binding"
	name     string
	kind     Kind // exchange
	internal bool // exchange
	args     amqp.Table
	binding  Binding
	role     role      // queue
	typ      QueueType // queue
}

// role is what a queue is for, to say what to do when it exists with other arguments.
type role int

const (
	workQueue role = iota
	poisonQueue
	levelQueue // a level or the parking queue
	heldQueue  // where a lane's held keys wait (HeldQueue)
)

// Declare declares the delay levels (unless disabled) and everything in t on ch, once t
// passes ValidateWith (ValidateFor, on a Builder ForServer; an error of that check ends
// warren's retry loops at once). Each call to the broker is bounded by ctx
// and Config.Timeout. An existing exchange or
// queue with other arguments gives a *MismatchError naming it and the argument.
func (b *Builder) Declare(ctx context.Context, ch *amqp.Channel, t Topology) error {
	if err := t.ValidateFor(b.cfg, b.server); err != nil {
		return amqpx.GiveUp(err) // retrying cannot change it
	}
	return b.declare(ctx, ch, append(b.delayObjects(), b.objects(t)...))
}

// DeclareTopology declares everything in t, as Declare does, but not the delay levels
// (only their delivery exchange, which t's work queues and exchanges are bound from): for
// when the levels were declared already.
func (b *Builder) DeclareTopology(ctx context.Context, ch *amqp.Channel, t Topology) error {
	if err := t.ValidateFor(b.cfg, b.server); err != nil {
		return amqpx.GiveUp(err) // retrying cannot change it
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

// Apply connects as conn says (retrying a failure to connect until conn.ConnectTimeout; a
// refused login, vhost or certificate is not retried) and declares t (and the delay
// levels), retrying a lost connection with backoff until the longer of conn.ConnectTimeout
// and Config.Timeout. No error contains a password of conn.URL.
//
// Before it declares anything it checks t (ValidateWith, and ValidateFor the broker's
// version once connected), and that every name t's bindings
// use without declaring it (an exchange another service declares, amq.topic) exists on the
// broker: a binding to a name that is nowhere is an error naming the binding, and nothing is
// declared.
func (b *Builder) Apply(ctx context.Context, conn warren.Connection, t Topology) error {
	if err := conn.Validate(); err != nil {
		return fmt.Errorf("topology: apply: %w", err)
	}
	if err := t.ValidateWith(b.cfg); err != nil {
		return err
	}
	conn = conn.WithDefaults()
	dialer := amqpx.NewDialer(conn, "warren topology", b.logger)
	return dialer.Run(ctx, max(conn.ConnectTimeout, b.cfg.Timeout), "topology: apply", func(ctx context.Context, conn *amqp.Connection) error {
		b := b.ForServer(amqpx.ServerVersion(conn))
		if err := t.ValidateFor(b.cfg, b.server); err != nil {
			return amqpx.GiveUp(err)
		}
		missing, err := b.unresolved(ctx, conn, t)
		if err != nil {
			return err
		}
		if len(missing) > 0 {
			return amqpx.GiveUp(fmt.Errorf("topology: nothing declared: %s", strings.Join(missing, "; ")))
		}
		refused, surplus, err := b.laneChanges(ctx, conn, t)
		if err != nil {
			return err
		}
		if len(refused) > 0 {
			return amqpx.GiveUp(fmt.Errorf("topology: nothing declared: %s", strings.Join(refused, "; ")))
		}
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("topology: open channel: %w", err)
		}
		if err := b.Declare(ctx, ch, t); err != nil {
			return err
		}
		// Lanes past the topology's, found empty and without consumers above.
		for _, lane := range surplus {
			if err := amqpx.Do(ctx, ch, func() error { _, err := ch.QueueDelete(lane, false, false, false); return err }); err != nil {
				return fmt.Errorf("topology: delete lane %q: %w", lane, err)
			}
		}
		return nil
	})
}

// declareBatch is how many declarations go to the broker before the builder waits for its
// answer: a channel carries out its methods in order, so one answer says that every method
// before it was done, and declaring without waiting for each one takes a third of the time
// on a local broker (see docs/decisions.md).
const declareBatch = 64

// declare declares objs in batches (declareBatch), each bounded by ctx and Config.Timeout.
func (b *Builder) declare(ctx context.Context, ch *amqp.Channel, objs []object) error {
	if len(objs) == 0 {
		return nil
	}
	closed := ch.NotifyClose(make(chan *amqp.Error, 1))
	for len(objs) > 0 {
		n := min(len(objs), declareBatch)
		if err := b.declareBatch(ctx, ch, objs[:n], closed); err != nil {
			return err
		}
		objs = objs[n:]
	}
	return nil
}

// declareBatch sends every object of objs but the last without waiting for the broker's
// answer (no-wait), and the last waiting for it. The broker answers a refusal by closing the
// channel and ignores what follows on it; the refusal, which closed reports, names the
// object it is about (refusedObject).
func (b *Builder) declareBatch(ctx context.Context, ch *amqp.Channel, objs []object, closed <-chan *amqp.Error) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	err := amqpx.Do(ctx, ch, func() error {
		for i, o := range objs {
			if err := o.declare(ch, i < len(objs)-1); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		return nil
	}
	if errors.Is(err, amqp.ErrClosed) {
		// the channel closed before the last send: its close says why, unless ctx ends first
		select {
		case e, ok := <-closed:
			if ok && e != nil {
				err = e
			}
		case <-ctx.Done():
		}
	}
	if o, ok := refusedObject(objs, err); ok {
		return declareError(o, err)
	}
	return fmt.Errorf("topology: declare %s %q and the %d objects after it: %w", objs[0].what, objs[0].name, len(objs)-1, err)
}

// declare declares o on ch, without waiting for the broker's answer when noWait.
func (o object) declare(ch *amqp.Channel, noWait bool) error {
	switch o.what {
	case "exchange":
		return ch.ExchangeDeclare(o.name, string(o.kind), true, false, o.internal, noWait, o.args)
	case "queue":
		_, err := ch.QueueDeclare(o.name, true, false, false, noWait, o.args)
		return err
	default:
		bd := o.binding
		if bd.ToExchange != "" {
			return ch.ExchangeBind(bd.ToExchange, bd.Key, bd.Exchange, noWait, bd.args())
		}
		return ch.QueueBind(bd.Queue, bd.Key, bd.Exchange, noWait, bd.args())
	}
}

// refusedObject returns the object of objs that the broker's refusal err is about: RabbitMQ
// names it in its reason ("inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/'",
// "no exchange 'e' in vhost '/'", on 3.10 and 4.x alike). A missing exchange or queue
// (404) is what a binding is refused for; anything else, a declaration. Among objects alike,
// the first that the reason names is the one refused: the broker stops at the first refusal.
func refusedObject(objs []object, err error) (object, bool) {
	var ae *amqp.Error
	if !errors.As(err, &ae) {
		return object{}, false
	}
	for _, o := range objs {
		if (o.what == "binding") != (ae.Code == amqp.NotFound) {
			continue
		}
		for _, name := range o.names() {
			if strings.Contains(ae.Reason, name) {
				return o, true
			}
		}
	}
	return object{}, false
}

// names are how the broker's reasons quote o, or what a binding refers to.
func (o object) names() []string {
	if o.what != "binding" {
		return []string{o.what + " '" + o.name + "'"}
	}
	bd := o.binding
	names := []string{"exchange '" + bd.Exchange + "'"}
	if bd.ToExchange != "" {
		return append(names, "exchange '"+bd.ToExchange+"'")
	}
	return append(names, "queue '"+bd.Queue+"'")
}

// declareOne declares o and waits for the broker's answer.
func (b *Builder) declareOne(ctx context.Context, ch *amqp.Channel, o object) error {
	ctx, cancel := context.WithTimeout(ctx, b.cfg.Timeout)
	defer cancel()
	if err := amqpx.Do(ctx, ch, func() error { return o.declare(ch, false) }); err != nil {
		return declareError(o, err)
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
		{what: "queue", name: d.ParkingQueue(), args: d.parkingArgs(), role: levelQueue, typ: d.QueueType},
		{what: "binding", name: "parking", binding: Binding{Exchange: d.ParkingExchange(), Queue: d.ParkingQueue()}},
		{what: "exchange", name: d.DeliveryExchange(), kind: Headers, args: amqp.Table{"alternate-exchange": d.ParkingExchange()}},
	}
}

// delayObjects are all of the delay levels. Every level exchange has the parking exchange as
// its alternate exchange: what it cannot route (a digit header missing, or not a digit) is
// parked, not dropped.
func (b *Builder) delayObjects() []object {
	d := b.cfg.Delay
	if d.Disabled {
		return nil
	}
	objs := b.deliveryObjects()
	for p := 0; p < d.Levels; p++ {
		objs = append(objs, object{what: "exchange", name: d.LevelExchange(p), kind: Headers,
			args: amqp.Table{"alternate-exchange": d.ParkingExchange()}})
	}
	for p := 0; p < d.Levels; p++ {
		zero := Binding{Exchange: d.LevelExchange(p), ToExchange: d.next(p), Headers: map[string]string{contract.DigitHeader(p): "0"}}
		objs = append(objs, object{what: "binding", name: zero.String(), binding: zero})
		for digit := 1; digit < d.Radix; digit++ {
			q := d.LevelQueue(p, digit)
			objs = append(objs, object{what: "queue", name: q, args: d.levelArgs(d.TTL(p, digit).Milliseconds(), d.next(p)),
				role: levelQueue, typ: d.QueueType})
			bd := Binding{Exchange: d.LevelExchange(p), Queue: q, Headers: map[string]string{contract.DigitHeader(p): strconv.Itoa(digit)}}
			objs = append(objs, object{what: "binding", name: bd.String(), binding: bd})
		}
	}
	for i := 1; i <= d.Chain(); i++ {
		next := d.LevelExchange(d.Levels - 1)
		if i > 1 {
			next = d.ChainExchange(i - 1)
		}
		q := d.ChainQueue(i)
		bd := Binding{Exchange: d.ChainExchange(i), Queue: q}
		objs = append(objs,
			object{what: "exchange", name: d.ChainExchange(i), kind: Fanout},
			object{what: "queue", name: q, args: d.levelArgs(d.ChainTTL().Milliseconds(), next), role: levelQueue, typ: d.QueueType},
			object{what: "binding", name: bd.String(), binding: bd})
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
		bd := Binding{Exchange: b.cfg.Delay.DeliveryExchange(), ToExchange: e.Name, Headers: map[string]string{contract.DestExchangeHeader: e.Name}}
		objs = append(objs, object{what: "binding", name: bd.String(), binding: bd})
	}
	return objs
}

// QueueType is the type of work queue q and its poison queue: q.Type, else Config.QueueType.
func (b *Builder) QueueType(q Queue) QueueType {
	if q.Type == "" {
		return b.cfg.QueueType
	}
	return q.Type
}

// QueueArgs are the arguments warren declares work queue q with. A quorum work queue has an
// explicit delivery limit, dead-letters into its poison queue at least once (which needs
// x-overflow reject-publish) and has Config.LeaderLocator as x-queue-leader-locator, if set
// (an x-queue-leader-locator in q.Args wins). A classic one is declared with no
// x-queue-type: classic is the broker's default.
func (b *Builder) QueueArgs(q Queue) amqp.Table {
	limit := q.DeliveryLimit
	if limit == 0 {
		limit = b.cfg.DeliveryLimit
	}
	args := amqp.Table{}
	for k, v := range q.Args {
		args[k] = v
	}
	args["x-dead-letter-exchange"] = ""
	args["x-dead-letter-routing-key"] = PoisonQueue(q.Name)
	if b.QueueType(q) == Quorum {
		args[amqp.QueueTypeArg] = amqp.QueueTypeQuorum
		args["x-delivery-limit"] = int64(limit)
		args["x-dead-letter-strategy"] = "at-least-once"
		args[amqp.QueueOverflowArg] = amqp.QueueOverflowRejectPublish
		args = withLeaderLocator(args, b.leaderLocator(q))
	}
	return args
}

// leaderLocator is the leader locator of quorum work queue q and its poison queue: the
// x-queue-leader-locator of q.Args, else Config.LeaderLocator.
func (b *Builder) leaderLocator(q Queue) LeaderLocator {
	if v, ok := q.Args[leaderLocatorArg].(string); ok {
		return LeaderLocator(v)
	}
	return b.cfg.LeaderLocator
}

// withLeaderLocator sets x-queue-leader-locator in the arguments of a quorum queue, unless
// l is "" (the broker's default) or args have one already. It returns args.
func withLeaderLocator(args amqp.Table, l LeaderLocator) amqp.Table {
	if _, ok := args[leaderLocatorArg]; !ok && l != "" {
		args[leaderLocatorArg] = string(l)
	}
	return args
}

// poisonArgs are the arguments of the poison queue of work queue q: of q's type and, quorum,
// without a delivery limit (see unlimited), not the work queue's: a poison message is there
// to be browsed and must never be dropped however often it is; it has the work queue's
// leader locator. A classic one has no arguments.
func (b *Builder) poisonArgs(q Queue) amqp.Table {
	if b.QueueType(q) == Quorum {
		return withLeaderLocator(amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum, "x-delivery-limit": unlimited}, b.leaderLocator(q))
	}
	return amqp.Table{}
}

func (b *Builder) queueObjects(q Queue) []object {
	typ := b.QueueType(q)
	// The work queue first: when it exists with another type, the error names it.
	objs := []object{
		{what: "queue", name: q.Name, args: b.QueueArgs(q), role: workQueue, typ: typ},
		{what: "queue", name: PoisonQueue(q.Name), args: b.poisonArgs(q), role: poisonQueue, typ: typ},
		{what: "exchange", name: KillExchange(q.Name), kind: Fanout},
	}
	if !b.cfg.Delay.Disabled {
		bd := Binding{Exchange: b.cfg.Delay.DeliveryExchange(), Queue: q.Name, Headers: map[string]string{contract.DestQueueHeader: q.Name}}
		objs = append(objs, object{what: "binding", name: bd.String(), binding: bd})
	}
	return append(objs, b.laneObjects(q)...)
}

// MismatchError reports an exchange or queue that exists with other arguments than the ones
// warren declares it with, and what to do about it.
type MismatchError struct {
	// What is "exchange" or "queue".
	What string
	Name string
	// Argument names the argument that differs: "argument x-queue-type" (or "argument" when
	// the broker did not say which).
	Argument string
	// Existing is the type of a queue that exists with another type than warren declares
	// (then Argument is "argument x-queue-type"), e.g. a classic work queue of an earlier
	// version of warren, which declared classic queues by default; "" otherwise.
	Existing QueueType
	// Hint says what to do.
	Hint string
	// Err is the broker's reply.
	Err error
}

// Error names the exchange or queue, the argument that differs and what to do.
func (e *MismatchError) Error() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "topology: %s %q exists with a different %s", e.What, e.Name, e.Argument)
	sb.WriteString(e.detail())
	fmt.Fprintf(&sb, ": %v", e.Err)
	return sb.String()
}

// detail is what e knows beyond the argument: the existing queue's type and the hint.
func (e *MismatchError) detail() string {
	var s string
	if e.Existing != "" {
		s = fmt.Sprintf(" (it is a %s queue)", e.Existing)
	}
	if e.Hint != "" {
		s += ": " + e.Hint
	}
	return s
}

// Unwrap returns the broker's reply.
func (e *MismatchError) Unwrap() error { return e.Err }

// IsMismatch reports whether err is, or wraps, a *MismatchError.
func IsMismatch(err error) bool {
	var m *MismatchError
	return errors.As(err, &m)
}

var (
	inequivalentArg = regexp.MustCompile(`inequivalent arg '([^']+)'`)
	currentValue    = regexp.MustCompile(`current is (?:the value )?'([^']*)'`)
	// invalidArg matches the broker's refusal of an argument that the queue's type does not
	// take: "invalid arg 'x-max-priority' for queue 'q' in vhost '/' of queue type
	// rabbit_quorum_queue" (3.10.8 and 4.0.5).
	invalidArg = regexp.MustCompile(`invalid arg '([^']+)' for queue .* of queue type `)
)

func declareError(o object, err error) error {
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.PreconditionFailed {
		return fmt.Errorf("topology: declare %s %q: %w", o.what, o.name, err)
	}
	if sm := invalidArg.FindStringSubmatch(ae.Reason); sm != nil && o.what == "queue" {
		return fmt.Errorf("topology: declare queue %q: RabbitMQ refuses argument %s on a %s queue: %w", o.name, sm[1], o.typ, err)
	}
	m := &MismatchError{What: o.what, Name: o.name, Argument: "argument", Err: err}
	arg := ""
	if sm := inequivalentArg.FindStringSubmatch(ae.Reason); sm != nil {
		arg = sm[1]
		m.Argument = "argument " + arg
	}
	if o.what == "queue" {
		if m.Existing = existingType(o.typ, arg, ae.Reason); m.Existing != "" {
			m.Argument = "argument " + amqp.QueueTypeArg
		}
	}
	m.Hint = hint(o, m.Existing, arg)
	return m
}

// existingType infers, from the broker's refusal to declare a queue of type declared with
// warren's arguments, the type the queue has when that is what differs; "" otherwise.
// RabbitMQ compares the arguments of the existing queue's type before the type itself: a
// classic queue declared as quorum is refused for x-overflow (warren declares every quorum
// queue that has x-overflow with x-dead-letter-strategy too, which a quorum queue lacking
// them would be refused for first), and a quorum queue declared as classic for
// x-dead-letter-strategy or x-delivery-limit, which no classic declaration has.
func existingType(declared QueueType, arg, reason string) QueueType {
	switch {
	case arg == amqp.QueueTypeArg:
		if sm := currentValue.FindStringSubmatch(reason); sm != nil {
			return QueueType(sm[1])
		}
		return Classic // "current is none": declared without a type, on 3.x a classic queue
	case declared == Quorum && arg == amqp.QueueOverflowArg && strings.HasSuffix(reason, "but current is none"):
		return Classic
	case declared == Classic && (arg == "x-dead-letter-strategy" || arg == "x-delivery-limit") &&
		strings.Contains(reason, "received none"):
		return Quorum
	}
	return ""
}

// hint says what to do about object o existing with other arguments (of type existing, when
// that is the difference; arg names the argument that differs, when the broker said).
func hint(o object, existing QueueType, arg string) string {
	switch {
	case o.what == "exchange":
		return "declare it as it is (Exchange.Kind, Exchange.Args), or delete it and let warren declare it again"
	case arg == leaderLocatorArg && o.role == levelQueue:
		return "the leader locator only places a queue when it is created: set Delay.LeaderLocator (or Config.LeaderLocator) " +
			`to the one the levels have ("" for none; a policy or the node's queue_leader_locator places new queues ` +
			"without an argument), or delete the delay levels of this name (once empty) and let warren declare them again"
	case arg == leaderLocatorArg:
		return "the leader locator only places a queue when it is created: set Config.LeaderLocator (or x-queue-leader-locator " +
			`in Queue.Args) to the one the queue has ("" for none; a policy or the node's queue_leader_locator places new ` +
			"queues without an argument); `rabbitmq-queues rebalance quorum` moves existing leaders"
	case o.role == levelQueue && existing != "":
		return fmt.Sprintf("set Delay.QueueType to topology.%s, or choose another Delay.Prefix", constName(existing))
	case o.role == levelQueue:
		return "delete the delay levels of this name (once empty), or choose another Delay.Prefix"
	case o.role == heldQueue:
		return "it is where the held keys of a lane wait (docs/ordering.md): release or skip them (`warren held`), " +
			"and once it is empty delete it and let warren declare it again"
	case o.role == poisonQueue:
		work := strings.TrimSuffix(o.name, PoisonQueue(""))
		keep := ""
		if existing != "" {
			keep = fmt.Sprintf("keep both %s (Queue.Type of %q, or Config.QueueType: topology.%s), or ", existing, work, constName(existing))
		}
		return fmt.Sprintf("it is the poison queue of %q: %smove its messages elsewhere, delete it and let warren declare it again", work, keep)
	case existing != "":
		return fmt.Sprintf("keep it %s (Queue.Type, or Config.QueueType: topology.%s), or drain and delete it "+
			"(`warren kill %s --delete`) and let warren declare it again as %s", existing, constName(existing), o.name, o.typ)
	}
	return fmt.Sprintf("declare it as it is (Queue.Args, Queue.DeliveryLimit, Queue.Type), or drain and delete it "+
		"(`warren kill %s --delete`) and let warren declare it again", o.name)
}

// constName is the name of the QueueType constant of t.
func constName(t QueueType) string {
	switch t {
	case Classic:
		return "Classic"
	case Quorum:
		return "Quorum"
	}
	return fmt.Sprintf("QueueType(%q)", t)
}
