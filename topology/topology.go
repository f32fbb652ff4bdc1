package topology

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Kind is an exchange type.
type Kind string

// The four exchange types.
const (
	Direct  Kind = amqp.ExchangeDirect
	Fanout  Kind = amqp.ExchangeFanout
	Topic   Kind = amqp.ExchangeTopic
	Headers Kind = amqp.ExchangeHeaders
)

// QueueType is the type of a durable queue.
type QueueType string

// Queue types. Quorum is warren's default for every queue it declares: messages that move
// between queues (a delay level to the next, a work queue to its poison queue) are
// dead-lettered at least once, and a work queue has a delivery limit. Classic queues
// dead-letter at most once and have no delivery limit; see Config.QueueType.
const (
	Classic QueueType = amqp.QueueTypeClassic
	Quorum  QueueType = amqp.QueueTypeQuorum
)

// LeaderLocator says on which node of a cluster RabbitMQ places the leader of a quorum queue
// when it creates the queue: the queue argument x-queue-leader-locator. It applies to the
// quorum queues warren declares (work, poison, delay level and parking queues), never to
// classic ones; see Config.LeaderLocator.
type LeaderLocator string

// Leader locators. The empty LeaderLocator, the default, declares no x-queue-leader-locator:
// the broker decides (a queue-leader-locator policy, else the node's queue_leader_locator
// setting, else client-local).
const (
	// ClientLocal places the leader on the node the declaring connection is connected to
	// (RabbitMQ's default).
	ClientLocal LeaderLocator = "client-local"
	// Balanced places the leader on the running node that leads the fewest queues, or on
	// a random one once the broker has 1,000 queues or more (RabbitMQ's
	// queue_count_start_random_selection; so on 3.10.8 and 4.0.5).
	Balanced LeaderLocator = "balanced"
)

// leaderLocatorArg is the queue argument of a LeaderLocator.
const leaderLocatorArg = "x-queue-leader-locator"

// Exchange is a durable exchange.
type Exchange struct {
	Name string `yaml:"name,omitempty" json:"name,omitempty"`
	// Kind defaults to Config.ExchangeKind.
	Kind     Kind `yaml:"kind,omitempty" json:"kind,omitempty"`
	Internal bool `yaml:"internal,omitempty" json:"internal,omitempty"`
	// AlternateExchange receives what this exchange cannot route.
	AlternateExchange string `yaml:"alternate_exchange,omitempty" json:"alternate_exchange,omitempty"`
	// Args are further arguments, passed as they are.
	Args amqp.Table `yaml:"args,omitempty" json:"args,omitempty"`
}

// Queue is a durable work queue. Declaring it also declares its poison queue (Name+".poison",
// where messages rejected without requeue, or past the quorum delivery limit, are
// dead-lettered) and its kill exchange (Name+".kill", a fanout), and binds it to the
// delivery exchange of the delay levels so that delayed messages can reach it.
type Queue struct {
	Name string `yaml:"name,omitempty" json:"name,omitempty"`
	// Type of the queue and its poison queue; defaults to Config.QueueType.
	Type QueueType `yaml:"type,omitempty" json:"type,omitempty"`
	// DeliveryLimit of a quorum work queue; defaults to Config.DeliveryLimit.
	DeliveryLimit int `yaml:"delivery_limit,omitempty" json:"delivery_limit,omitempty"`
	// Args are further arguments, passed as they are.
	Args amqp.Table `yaml:"args,omitempty" json:"args,omitempty"`
	// Lanes, above 0, orders the queue by key (see warren.OrderBy and docs/ordering.md): its
	// messages go, by their key's hash (Lane), to one of Lanes lane queues (LaneQueue), each
	// with a single active consumer, dead-lettering into the queue's poison queue. The queue
	// itself is declared too: a message without a lane arrives there. At most MaxLanes.
	Lanes int `yaml:"lanes,omitempty" json:"lanes,omitempty"`
}

// PoisonQueue is the name of the poison queue of work queue queue.
func PoisonQueue(queue string) string { return queue + ".poison" }

// KillExchange is the name of the kill fanout exchange of work queue queue, declared with
// it: every consumer of the queue listens to it (see the kill package, which names the kill
// state and lock queues too).
func KillExchange(queue string) string { return queue + ".kill" }

// Binding routes from exchange Exchange to queue Queue or, when ToExchange is set, to that
// exchange.
type Binding struct {
	Exchange   string `yaml:"exchange,omitempty" json:"exchange,omitempty"`
	Queue      string `yaml:"queue,omitempty" json:"queue,omitempty"`
	ToExchange string `yaml:"to_exchange,omitempty" json:"to_exchange,omitempty"`
	// Key is the binding key (direct, topic).
	Key string `yaml:"key,omitempty" json:"key,omitempty"`
	// Headers to match (headers exchanges). Names must not start with "x-": the broker
	// ignores such binding arguments.
	Headers map[string]string `yaml:"headers,omitempty" json:"headers,omitempty"`
	// MatchAny matches when any header matches; the default is all.
	MatchAny bool `yaml:"match_any,omitempty" json:"match_any,omitempty"`
}

func (b Binding) args() amqp.Table {
	if len(b.Headers) == 0 {
		return nil
	}
	t := amqp.Table{"x-match": "all"}
	if b.MatchAny {
		t["x-match"] = "any"
	}
	for k, v := range b.Headers {
		t[k] = v
	}
	return t
}

// String describes the binding for reports and errors.
func (b Binding) String() string {
	to := "queue " + b.Queue
	if b.ToExchange != "" {
		to = "exchange " + b.ToExchange
	}
	return "binding " + b.Exchange + " -> " + to + " (key " + strconv.Quote(b.Key) + ")"
}

// Topology is a declarative description of exchanges, work queues and bindings.
type Topology struct {
	Exchanges []Exchange `yaml:"exchanges,omitempty" json:"exchanges,omitempty"`
	Queues    []Queue    `yaml:"queues,omitempty" json:"queues,omitempty"`
	Bindings  []Binding  `yaml:"bindings,omitempty" json:"bindings,omitempty"`
}

// Config configures a Builder. The zero value is usable: every field has a default.
type Config struct {
	// Delay is the layout of the delay levels.
	Delay Delay `yaml:"delay,omitempty" json:"delay,omitempty"`
	// QueueType of the queues warren declares: work queues that do not set Queue.Type, their
	// poison queues, and the delay level and parking queues unless Delay.QueueType is set.
	// Default quorum: at-least-once dead-lettering, an explicit delivery limit on work
	// queues, replicated in a cluster.
	//
	// Classic is the switch for everything at once (one node, no replication), and it gives
	// up three things. (1) Dead-lettering out of a classic queue is at-most-once: a broker
	// kill -9 lost 195 of 400 messages waiting in classic delay levels, and retries with
	// them (quorum levels lost none; docs/decisions.md). (2) A classic work queue has no
	// delivery limit: a message the client library cannot even parse (it closes the
	// connection, so no handler ever sees it) is redelivered for ever and blocks the
	// messages behind it. (3) A classic queue lives on one node.
	QueueType QueueType `yaml:"queue_type,omitempty" json:"queue_type,omitempty"`
	// DeliveryLimit of quorum work queues that do not set one: a message returned to the
	// queue this many times is dead-lettered into the poison queue. Default 20 (declared
	// explicitly: RabbitMQ 4.0 applies 20 by default, earlier versions none).
	DeliveryLimit int `yaml:"delivery_limit,omitempty" json:"delivery_limit,omitempty"`
	// LeaderLocator of the quorum queues warren declares: work queues (unless Queue.Args set
	// x-queue-leader-locator), their poison queues, and the delay level and parking queues
	// unless Delay.LeaderLocator is set. Balanced spreads the leaders over a cluster (on
	// one node it changes nothing); ClientLocal puts them on the node the declaring
	// connection is connected to. Default "": no x-queue-leader-locator, the broker decides
	// (a queue-leader-locator policy, else the node's queue_leader_locator setting in
	// rabbitmq.conf, else client-local; a policy wins over the argument too).
	//
	// Default "" because the broker compares the argument when a queue is declared again:
	// measured on RabbitMQ 3.10.8 and 4.0.5, a quorum queue that exists without it is
	// refused (PRECONDITION_FAILED, inequivalent arg 'x-queue-leader-locator') when declared
	// with it, and one that exists with it when declared without it or with the other
	// value, so a default would break every deployment whose queues already exist. With
	// queues that already exist, leave it "" and spread new queues with the node setting
	// queue_leader_locator = balanced, or a policy (neither is an argument, so neither is
	// compared); `rabbitmq-queues rebalance quorum` moves the leaders of existing queues. A
	// queue refused for it gives a *MismatchError naming x-queue-leader-locator.
	//
	// Classic queues are declared without it: RabbitMQ 3.10.8 refuses x-queue-leader-locator
	// on a classic queue, and warren does not set the classic x-queue-master-locator either
	// (a classic queue lives on one node; 3.10.8 answers x-queue-master-locator balanced
	// with a connection error).
	LeaderLocator LeaderLocator `yaml:"leader_locator,omitempty" json:"leader_locator,omitempty"`
	// ExchangeKind of exchanges that do not set one. Default topic.
	ExchangeKind Kind `yaml:"exchange_kind,omitempty" json:"exchange_kind,omitempty"`
	// Timeout bounds each call to the broker; declarations go in batches of up to 64 sent
	// without waiting for each answer, and a batch is one call. Default 30s.
	Timeout time.Duration `yaml:"-" json:"-"`
}

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	if c.QueueType == "" {
		c.QueueType = Quorum
	}
	if c.Delay.QueueType == "" {
		c.Delay.QueueType = c.QueueType
	}
	if c.Delay.LeaderLocator == "" {
		c.Delay.LeaderLocator = c.LeaderLocator
	}
	c.Delay = c.Delay.WithDefaults()
	if c.DeliveryLimit == 0 {
		c.DeliveryLimit = DefaultDeliveryLimit
	}
	if c.ExchangeKind == "" {
		c.ExchangeKind = Topic
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	return c
}

// Defaults of Config.
const (
	DefaultDeliveryLimit = 20
	DefaultTimeout       = 30 * time.Second
)

// Validate reports the first field of c (with defaults applied) that is not usable.
func (c Config) Validate() error {
	// Config.LeaderLocator first: Delay.LeaderLocator inherits it.
	if err := validLeaderLocator("Config.LeaderLocator", c.LeaderLocator); err != nil {
		return err
	}
	c = c.WithDefaults()
	if err := c.Delay.Validate(); err != nil {
		return err
	}
	if err := validQueueType("Config.QueueType", c.QueueType); err != nil {
		return err
	}
	if c.DeliveryLimit < 1 {
		return fmt.Errorf("topology: Config.DeliveryLimit %d is less than 1", c.DeliveryLimit)
	}
	if err := validKind("Config.ExchangeKind", c.ExchangeKind); err != nil {
		return err
	}
	if c.Timeout < 0 {
		return fmt.Errorf("topology: Config.Timeout %s is negative", c.Timeout)
	}
	return nil
}

// Validate reports the first element of t that cannot be declared.
func (t Topology) Validate() error {
	for i, e := range t.Exchanges {
		if e.Name == "" {
			return fmt.Errorf("topology: Exchanges[%d].Name is empty", i)
		}
		if len(e.Name) > maxName {
			return fmt.Errorf("topology: Exchanges[%d].Name is %d bytes long, more than %d", i, len(e.Name), maxName)
		}
		if e.Kind != "" {
			if err := validKind(fmt.Sprintf("Exchanges[%d].Kind", i), e.Kind); err != nil {
				return err
			}
		}
	}
	for i, q := range t.Queues {
		if q.Name == "" {
			return fmt.Errorf("topology: Queues[%d].Name is empty", i)
		}
		if strings.HasPrefix(q.Name, "amq.") {
			return fmt.Errorf("topology: Queues[%d].Name %q: names starting with amq. are reserved", i, q.Name)
		}
		if len(PoisonQueue(q.Name)) > maxName {
			return fmt.Errorf("topology: Queues[%d].Name is %d bytes long: with its poison queue's suffix it exceeds %d", i, len(q.Name), maxName)
		}
		if q.Type != "" {
			if err := validQueueType(fmt.Sprintf("Queues[%d].Type", i), q.Type); err != nil {
				return err
			}
		}
		if q.DeliveryLimit < 0 {
			return fmt.Errorf("topology: Queues[%d].DeliveryLimit %d is negative", i, q.DeliveryLimit)
		}
		if q.Lanes < 0 || q.Lanes > MaxLanes {
			return fmt.Errorf("topology: Queues[%d].Lanes %d is outside 0..%d", i, q.Lanes, MaxLanes)
		}
		if q.Lanes > 0 && len(LaneQueue(q.Name, q.Lanes-1)) > maxName {
			return fmt.Errorf("topology: Queues[%d].Name is %d bytes long: with its lanes' suffix it exceeds %d", i, len(q.Name), maxName)
		}
	}
	for i, b := range t.Bindings {
		switch {
		case b.Exchange == "":
			return fmt.Errorf("topology: Bindings[%d].Exchange is empty (the default exchange cannot be bound)", i)
		case (b.Queue == "") == (b.ToExchange == ""):
			return fmt.Errorf("topology: Bindings[%d] needs exactly one of Queue and ToExchange", i)
		}
		for k := range b.Headers {
			if strings.HasPrefix(strings.ToLower(k), "x-") {
				return fmt.Errorf("topology: Bindings[%d].Headers[%q]: a headers exchange ignores binding arguments starting with x-", i, k)
			}
		}
	}
	return nil
}

func validKind(field string, k Kind) error {
	switch k {
	case Direct, Fanout, Topic, Headers:
		return nil
	}
	return fmt.Errorf("topology: %s %q is not one of direct, fanout, topic, headers", field, k)
}

func validLeaderLocator(field string, l LeaderLocator) error {
	switch l {
	case "", ClientLocal, Balanced:
		return nil
	}
	return fmt.Errorf("topology: %s %q is not one of \"\" (the broker's default), %q, %q", field, l, ClientLocal, Balanced)
}

func validQueueType(field string, t QueueType) error {
	if t == Classic || t == Quorum {
		return nil
	}
	return fmt.Errorf("topology: %s %q is neither %q nor %q", field, t, Classic, Quorum)
}
