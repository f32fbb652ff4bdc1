package topology

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/warrenmq/warren/internal/contract"
)

// maxTTL is the largest x-message-ttl RabbitMQ accepts, in milliseconds.
const maxTTL = 1<<32 - 1

// Delay describes the delay levels: fixed-TTL queues that together hold a message for any
// delay up to Max, without a broker plugin and without head-of-line blocking.
//
// A delay is written in base Radix, in Units, with Levels digits. Position p has Radix-1
// queues, one per nonzero digit d, each with the fixed x-message-ttl d·Radix^p·Unit, and a
// headers exchange that routes by the digit header of position p: a nonzero digit to its
// queue, a zero digit straight on (exchange-to-exchange binding) to position p-1. A queue
// dead-letters into position p-1 too, and position 0 into the delivery exchange, which
// routes by the destination header to the destination exchange or queue, keeping the
// message's routing key. A message enters at its highest nonzero digit and waits exactly
// the sum of its digits' TTLs. Every queue has one TTL, so expiry order is arrival order.
//
// The delivery exchange has an alternate exchange into the parking queue: a message whose
// destination was deleted while it waited is parked there, never lost and never stalling a
// level. So has every level exchange: a message whose digit header is missing or not a digit
// (a foreign message published to a level exchange) is parked with its headers, not dropped.
//
// Delays above the levels' own maximum (2³²-1 ms with the defaults: RabbitMQ's largest TTL)
// wait first in a chain: Chain queues, each with the TTL ChainTTL and a fanout exchange in
// front, where queue i dead-letters into exchange i-1 and queue 1 into the top level
// exchange. A message enters the chain at the exchange of the number of hops it needs and
// carries the digits of the rest of its delay, top position included (a zero digit there
// passes straight on). No queue is visited twice (RabbitMQ drops a message that expires
// into a queue it expired from before), so reaching further takes one more queue per
// ChainTTL: 73 for Reach's default of 10 years.
//
// The queues are quorum queues by default, dead-lettering at least once from one level to
// the next; classic ones (QueueType) dead-letter at most once and lose messages when the
// broker crashes. The queue type is part of every name (Name), so classic and quorum levels
// never collide: levels of the other type drain into their own delivery exchange.
type Delay struct {
	// Prefix starts every name of the delay levels. Default "warren.delay".
	Prefix string `yaml:"prefix,omitempty" json:"prefix,omitempty"`
	// Unit is the resolution: every delay is rounded up to a whole number of units.
	// A whole number of milliseconds; default 1ms.
	Unit time.Duration `yaml:"unit,omitempty" json:"unit,omitempty"`
	// Radix is the base of a delay's digits: larger means fewer hops (each costs the
	// broker a few milliseconds) and more queues ((Radix-1)·Levels). Default 16.
	Radix int `yaml:"radix,omitempty" json:"radix,omitempty"`
	// Levels is the number of digit positions. Default: as many as RabbitMQ's largest TTL
	// (2³²-1 ms) allows; with the other defaults 8, for delays up to 2³²-1 ms (49.7 days)
	// in 120 queues.
	Levels int `yaml:"levels,omitempty" json:"levels,omitempty"`
	// Reach is the longest delay: above the levels' maximum, the chain of queues makes up the
	// rest (see Delay). Default 10 years when Levels is left to its default; when Levels is
	// set, the levels' maximum (no chain). A Reach at or below the levels' maximum declares
	// no chain.
	Reach time.Duration `yaml:"reach,omitempty" json:"reach,omitempty"`
	// QueueType of the level and parking queues. Within a Config it defaults to
	// Config.QueueType, on its own to quorum (at-least-once dead-lettering from one level to
	// the next). Classic level queues are queue version 2 (declared explicitly) and
	// dead-letter at most once: a broker crash loses messages that were moving between
	// levels (see Config.QueueType).
	QueueType QueueType `yaml:"queue_type,omitempty" json:"queue_type,omitempty"`
	// LeaderLocator of the quorum level and parking queues: Balanced spreads their leaders
	// over a cluster, so that one node does not carry every hop of every delayed message.
	// Within a Config it defaults to Config.LeaderLocator, on its own to "" (no
	// x-queue-leader-locator: the broker's default, client-local unless a policy or the
	// node's queue_leader_locator setting says otherwise). Levels that exist without it
	// (or with another value) are refused when declared with it: see Config.LeaderLocator.
	// Not set on classic levels.
	LeaderLocator LeaderLocator `yaml:"leader_locator,omitempty" json:"leader_locator,omitempty"`
	// Disabled declares no delay levels; delayed publishing is then an error.
	Disabled bool `yaml:"disabled,omitempty" json:"disabled,omitempty"`
}

// Defaults of Delay. Levels defaults to the most that RabbitMQ's largest TTL allows.
const (
	DefaultDelayPrefix = "warren.delay"
	DefaultDelayUnit   = time.Millisecond
	DefaultDelayRadix  = 16
	// DefaultDelayReach is 10 years of 365.25 days.
	DefaultDelayReach = 87660 * time.Hour
)

// maxChain is the most chain queues Validate accepts: a longer chain means a Reach far
// beyond what the levels were sized for.
const maxChain = 1000

// WithDefaults returns d with every unset field set to its default.
func (d Delay) WithDefaults() Delay {
	if d.Prefix == "" {
		d.Prefix = DefaultDelayPrefix
	}
	if d.Unit == 0 {
		d.Unit = DefaultDelayUnit
	}
	if d.Radix == 0 {
		d.Radix = DefaultDelayRadix
	}
	if d.Levels == 0 && d.Reach == 0 {
		d.Reach = DefaultDelayReach
	}
	if d.Levels == 0 && d.Radix >= 2 && d.Unit >= time.Millisecond {
		// The most positions whose largest queue TTL, (Radix-1)·Radix^(Levels-1)·Unit,
		// stays within RabbitMQ's limit.
		for top := float64(d.Radix-1) * float64(d.Unit.Milliseconds()); top <= maxTTL; top *= float64(d.Radix) {
			d.Levels++
		}
	}
	if d.QueueType == "" {
		d.QueueType = Quorum
	}
	return d
}

// Validate reports the first field of d (with defaults applied) that is not usable.
func (d Delay) Validate() error {
	d = d.WithDefaults()
	switch {
	case d.Disabled:
		return nil
	case d.Unit < time.Millisecond || d.Unit%time.Millisecond != 0:
		return fmt.Errorf("topology: Delay.Unit %s is not a whole number of milliseconds", d.Unit)
	case d.Radix < 2 || d.Radix > 256:
		return fmt.Errorf("topology: Delay.Radix %d is outside 2..256", d.Radix)
	case d.Levels < 1:
		return fmt.Errorf("topology: Delay.Levels %d is less than 1", d.Levels)
	case d.QueueType != Classic && d.QueueType != Quorum:
		return fmt.Errorf("topology: Delay.QueueType %q is neither %q nor %q", d.QueueType, Classic, Quorum)
	}
	if err := validLeaderLocator("Delay.LeaderLocator", d.LeaderLocator); err != nil {
		return err
	}
	top := float64(d.Radix-1) * math.Pow(float64(d.Radix), float64(d.Levels-1)) * float64(d.Unit.Milliseconds())
	if top > maxTTL {
		return fmt.Errorf("topology: Delay.Levels %d with Radix %d and Unit %s needs a queue TTL of %.0f ms, above RabbitMQ's limit of %d ms",
			d.Levels, d.Radix, d.Unit, top, int64(maxTTL))
	}
	switch n := d.Chain(); {
	case d.Reach < 0:
		return fmt.Errorf("topology: Delay.Reach %s is negative", d.Reach)
	case n > maxChain:
		return fmt.Errorf("topology: Delay.Reach %s needs %d chain queues of %s, more than %d: raise Delay.Levels or Delay.Unit",
			d.Reach, n, d.ChainTTL(), maxChain)
	}
	if strings.HasPrefix(d.Prefix, "amq.") {
		return fmt.Errorf("topology: Delay.Prefix %q: names starting with amq. are reserved", d.Prefix)
	}
	for _, longest := range []string{d.LevelQueue(d.Levels-1, d.Radix-1), d.ChainQueue(d.Chain())} {
		if len(longest) > maxName {
			return fmt.Errorf("topology: Delay.Prefix %q makes names such as %q longer than %d bytes", d.Prefix, longest, maxName)
		}
	}
	return nil
}

// maxName is the longest name of a queue or exchange that RabbitMQ accepts, in bytes.
const maxName = 255

// Name identifies this layout; every exchange and queue of it starts with Name. It includes
// the queue type, unit and radix, so layouts that differ never collide:
// "warren.delay.quorum.1ms.r16" by default.
func (d Delay) Name() string {
	d = d.WithDefaults()
	return d.Prefix + "." + string(d.QueueType) + "." + strconv.FormatInt(d.Unit.Milliseconds(), 10) + "ms.r" + strconv.Itoa(d.Radix)
}

// LevelExchange is the headers exchange of position p.
func (d Delay) LevelExchange(p int) string { return d.Name() + ".p" + strconv.Itoa(p) }

// LevelQueue is the queue of digit digit at position p.
func (d Delay) LevelQueue(p, digit int) string {
	return d.LevelExchange(p) + ".d" + strconv.Itoa(digit)
}

// DeliveryExchange is the headers exchange that hands a message to its destination.
func (d Delay) DeliveryExchange() string { return d.Name() + ".deliver" }

// ParkingExchange is the alternate exchange of the delivery exchange and of every level
// exchange.
func (d Delay) ParkingExchange() string { return d.Name() + ".parking" }

// ParkingQueue holds delayed messages whose destination no longer existed on arrival, and
// messages that a level exchange could not route (a missing or bad digit header). Its name
// is ParkingQueueName(d.Name()).
func (d Delay) ParkingQueue() string { return ParkingQueueName(d.Name()) }

// parkedSuffix ends the name of every parking queue.
const parkedSuffix = ".parked"

// layoutName matches the end of a Delay.Name: its queue type, unit and radix, after a prefix.
var layoutName = regexp.MustCompile(`\.(?:` + string(Quorum) + `|` + string(Classic) + `)\.\d+ms\.r\d+$`)

// ParkingQueueName is the name of the parking queue of the delay levels whose Delay.Name is
// layout: layout followed by ".parked".
func ParkingQueueName(layout string) string { return layout + parkedSuffix }

// ParseParkingQueue is the reverse of ParkingQueueName: when queue is named as the parking
// queue of any delay levels (a Delay.Name, whatever its prefix, followed by ".parked"), it
// returns that Delay.Name and true; otherwise "" and false.
func ParseParkingQueue(queue string) (layout string, ok bool) {
	layout, ok = strings.CutSuffix(queue, parkedSuffix)
	if !ok || !layoutName.MatchString(layout) {
		return "", false
	}
	return layout, true
}

// ChainExchange is the fanout exchange in front of ChainQueue(i), 1 ≤ i ≤ Chain().
func (d Delay) ChainExchange(i int) string { return d.Name() + ".c" + strconv.Itoa(i) }

// ChainQueue is the chain queue a message enters with i chain hops to go.
func (d Delay) ChainQueue(i int) string { return d.ChainExchange(i) + ".q" }

// LedgerQueue is the stream that records the messages scheduled with an id (warren.Schedule),
// their cancellations and deliveries (package ledger). Declared on first use.
func (d Delay) LedgerQueue() string { return d.Name() + ".ledger" }

// ledgerArgs declare the ledger: a stream (durable, replicated in a cluster, read from any
// offset without removing anything) that keeps its records a little over 10 years, the
// default Reach. The age is fixed rather than derived from Reach: layouts that differ only
// in Levels or Reach share the name, and must declare it alike.
var ledgerArgs = amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeStream, amqp.StreamMaxAgeArg: "3700D"}

// DeclareLedger declares d's ledger stream (LedgerQueue) on ch.
func DeclareLedger(ch *amqp.Channel, d Delay) error {
	_, err := ch.QueueDeclare(d.LedgerQueue(), true, false, false, false, ledgerArgs)
	if err != nil {
		return fmt.Errorf("topology: declare the ledger %q: %w", d.LedgerQueue(), err)
	}
	return nil
}

// Names lists every queue and exchange of the levels and the chain (to inspect or remove
// them); not the ledger (LedgerQueue), whose records are no messages waiting.
func (d Delay) Names() (queues, exchanges []string) {
	d = d.WithDefaults()
	queues = []string{d.ParkingQueue()}
	exchanges = []string{d.ParkingExchange(), d.DeliveryExchange()}
	for p := 0; p < d.Levels; p++ {
		exchanges = append(exchanges, d.LevelExchange(p))
		for digit := 1; digit < d.Radix; digit++ {
			queues = append(queues, d.LevelQueue(p, digit))
		}
	}
	for i := 1; i <= d.Chain(); i++ {
		exchanges = append(exchanges, d.ChainExchange(i))
		queues = append(queues, d.ChainQueue(i))
	}
	return queues, exchanges
}

// TTL is the fixed x-message-ttl of LevelQueue(p, digit).
func (d Delay) TTL(p, digit int) time.Duration {
	d = d.WithDefaults()
	return time.Duration(digit) * time.Duration(pow(d.Radix, p)) * d.Unit
}

// Max is the longest delay the levels and the chain can hold: at least Reach.
func (d Delay) Max() time.Duration {
	d = d.WithDefaults()
	return d.levelsMax() + time.Duration(d.Chain())*d.ChainTTL()
}

// levelsMax is the longest delay the levels alone can hold.
func (d Delay) levelsMax() time.Duration {
	return time.Duration(pow(d.Radix, d.Levels)-1) * d.Unit
}

// ChainTTL is the x-message-ttl of every chain queue: the levels' maximum, or RabbitMQ's
// largest TTL (in whole units) when that is less. It is at most the levels' maximum, so
// that what remains after the chain always fits in the levels.
func (d Delay) ChainTTL() time.Duration {
	d = d.WithDefaults()
	return min(d.levelsMax(), maxTTL*time.Millisecond/d.Unit*d.Unit)
}

// Chain is the number of chain queues: enough for Reach, none when the levels reach it.
func (d Delay) Chain() int {
	d = d.WithDefaults()
	if d.Disabled || d.Reach <= d.levelsMax() || d.Unit < time.Millisecond || d.Radix < 2 || d.Levels < 1 {
		return 0
	}
	c := d.ChainTTL()
	if c <= 0 { // a Unit above the largest TTL: refused by Validate
		return 0
	}
	return int((d.Reach - d.levelsMax() + c - 1) / c)
}

// QueueCount is the number of level and chain queues (the parking queue not included).
func (d Delay) QueueCount() int {
	d = d.WithDefaults()
	return (d.Radix-1)*d.Levels + d.Chain()
}

// unlimited is the x-delivery-limit of quorum poison and parking queues: they are only
// browsed (a message returned to them is requeued, never dead-lettered or dropped), and
// they have no dead-letter exchange, so past a limit a message would be dropped. Neither
// omitting the argument nor -1 or 0 says "unlimited" on every version: omitted, RabbitMQ 4.0
// applies 20; measured here, -1 and 0 drop a message after its first return on 3.10.8 while
// -1 means unlimited on 4.0.5. 2³¹-1 behaves as unlimited on both.
const unlimited = int64(math.MaxInt32)

// typeArgs are the type arguments of the level and parking queues. Their type is declared
// explicitly, whatever the broker's default queue type. Classic ones are version 2
// (x-queue-version, RabbitMQ 3.10+; the only version from 4.3): on version 1, level queues
// stalled at times and delivered late (docs/decisions.md: Classic level queues are version
// 2). Quorum ones carry the leader locator, if any.
func (d Delay) typeArgs() amqp.Table {
	if d.QueueType == Quorum {
		return withLeaderLocator(amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}, d.LeaderLocator)
	}
	return amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeClassic, amqp.QueueVersionArg: int32(2)}
}

// parkingArgs are the arguments of the parking queue.
func (d Delay) parkingArgs() amqp.Table {
	args := d.typeArgs()
	if d.QueueType == Quorum {
		args["x-delivery-limit"] = unlimited
	}
	return args
}

// levelArgs are the arguments of a level queue whose messages wait ttl ms, then go to next.
// Quorum ones dead-letter at least once, which needs x-overflow reject-publish (with the
// default drop-head RabbitMQ falls back to at most once).
func (d Delay) levelArgs(ttl int64, next string) amqp.Table {
	args := d.typeArgs()
	args[amqp.QueueMessageTTLArg] = ttl
	args["x-dead-letter-exchange"] = next
	if d.QueueType == Quorum {
		args["x-dead-letter-strategy"] = "at-least-once"
		args[amqp.QueueOverflowArg] = amqp.QueueOverflowRejectPublish
	}
	return args
}

// next is where position p leads: position p-1, or the delivery exchange after position 0.
func (d Delay) next(p int) string {
	if p == 0 {
		return d.DeliveryExchange()
	}
	return d.LevelExchange(p - 1)
}

// Plan is how one delayed message travels through the levels.
type Plan struct {
	// Delay is the delay the message will wait: the requested one rounded up to the unit.
	Delay time.Duration
	// Exchange is the level exchange to publish to; empty when the delay rounds to zero.
	Exchange string
	// Headers carry the digits, from the entry position down to position 0.
	Headers amqp.Table
	// Hops is the number of level queues the message waits in.
	Hops int
}

// ErrDelayTooLong is wrapped by Plan when a delay exceeds Max.
var ErrDelayTooLong = errors.New("delay exceeds the maximum of the delay levels")

// Plan rounds delay up to the unit (never down: a message is never delivered early) and
// writes it in digits. A negative delay, or one above Max, is an error naming the value.
func (d Delay) Plan(delay time.Duration) (Plan, error) {
	d = d.WithDefaults()
	if d.Disabled {
		return Plan{}, errors.New("topology: the delay levels are disabled")
	}
	if delay < 0 {
		return Plan{}, fmt.Errorf("topology: delay %s is negative", delay)
	}
	if delay > d.Max() {
		return Plan{}, fmt.Errorf("topology: delay %s: %w %s (%s)", delay, ErrDelayTooLong, d.Max(), d.Name())
	}
	units := int64((delay + d.Unit - 1) / d.Unit)
	plan := Plan{Delay: time.Duration(units) * d.Unit}
	if units == 0 {
		return plan, nil
	}
	// Above the levels' maximum, the fewest chain hops that leave a rest within it.
	chain, top := 0, 0
	if levels := int64(d.levelsMax() / d.Unit); units > levels {
		c := int64(d.ChainTTL() / d.Unit)
		chain = int((units - levels + c - 1) / c)
		units -= int64(chain) * c
		top = d.Levels - 1 // the chain leads into the top level exchange
	}
	plan.Headers = amqp.Table{}
	for p := 0; units > 0 || p <= top; p++ {
		digit := int(units % int64(d.Radix))
		units /= int64(d.Radix)
		plan.Headers[contract.DigitHeader(p)] = strconv.Itoa(digit)
		if digit != 0 {
			plan.Hops++
		}
		top = max(top, p)
	}
	plan.Exchange = d.LevelExchange(top)
	if chain > 0 {
		plan.Exchange = d.ChainExchange(chain)
		plan.Hops += chain
	}
	return plan, nil
}

func pow(radix, n int) int64 {
	v := int64(1)
	for range n {
		v *= int64(radix)
	}
	return v
}
