package ops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/held"
	"github.com/warrenmq/warren/internal/mgmt"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/topology"
)

// QueueStatus is the state of one work queue.
type QueueStatus struct {
	Queue string `json:"queue"`
	// Exists is false for a queue the broker does not have; the other fields are then zero.
	Exists bool `json:"exists"`
	// State is the queue's state as the management API tells it (see Config.Management):
	// running, idle or flow when it serves messages; down, minority, ... when it does not
	// (its Ready is then no count: the broker answers 0 for a quorum queue that is down);
	// "unknown" when the broker has no statistics of it yet. "" without the management API:
	// AMQP 0-9-1 cannot tell.
	State string `json:"state,omitempty"`
	// Ready is the number of messages waiting to be delivered.
	Ready int `json:"ready"`
	// Unacked is the number of messages delivered and not yet acknowledged, which only the
	// management API tells (-1 without it).
	Unacked int `json:"unacked"`
	// Consumers is the number of consumers of the queue (one per router handler).
	Consumers int `json:"consumers"`
	// ConsumerHosts are the hosts of the consumers' connections, as the broker sees them,
	// with how many consumers each when more than one ("10.0.0.5 (3)"): management API only.
	ConsumerHosts []string `json:"consumer_hosts,omitempty"`
	// Kill is the remembered kill command ("stop", "delete", or "resume" once lifted), "" if
	// the queue was never killed; KillAt is when it was sent.
	Kill   kill.Action `json:"kill,omitempty"`
	KillAt time.Time   `json:"kill_at,omitzero"`
	// Poison is the number of messages in its poison queue (-1 if there is none): the ready
	// ones, and with the management API the larger of that and all it holds, those delivered
	// and not acknowledged included (a browse of the queue holds what it read).
	Poison int `json:"poison"`
	// Held is the number of held keys of a queue ordered by key (see Ops.Held): keys whose
	// message was poisoned and whose later messages wait for a release or a skip. 0 when
	// nothing was ever held.
	Held int `json:"held"`
}

// Unavailable reports whether the management API says the queue does not serve messages
// (down, minority, ...; see QueueStatus.State).
func (q QueueStatus) Unavailable() bool { return unavailable(q.State) }

// unavailable reports whether state, a mgmt.Queue.Status or "", is known and not serving.
func unavailable(state string) bool {
	return state != "" && state != "unknown" && !(mgmt.Queue{State: state}).Serving()
}

// LevelStatus is one delay level queue.
type LevelStatus struct {
	Queue string `json:"queue"`
	// TTL is how long a message waits in it; in JSON ttl_ms, in milliseconds (see MarshalJSON).
	TTL time.Duration `json:"-"`
	// DueWithin bounds when a message waiting in it comes due: its TTL and the most the
	// lower levels can add ((Radix^p-1)·Unit). In JSON due_within_ms.
	DueWithin time.Duration `json:"-"`
	// Messages is the number of messages waiting in it: for AMQP 0-9-1 those not yet expired;
	// with the management API the ones it is dead-lettering too (DeadLettering).
	Messages int  `json:"messages"`
	Exists   bool `json:"exists"`
	// State is as QueueStatus.State.
	State string `json:"state,omitempty"`
	// DeadLettering is the number of messages that expired in the level and that the next
	// one has not yet confirmed (management API only). They pass in milliseconds; where they
	// stay, dead-lettering is stuck (see amqpx.DeadLetterWarning).
	DeadLettering int `json:"dead_lettering"`
}

// Unavailable reports whether the management API says the level does not serve messages.
func (l LevelStatus) Unavailable() bool { return unavailable(l.State) }

// DelayStatus is the state of the delay levels.
type DelayStatus struct {
	// Name of the layout (topology.Delay.Name).
	Name string `json:"name"`
	// Levels lists every level queue, then every chain queue (topology.Delay.ChainQueue).
	Levels []LevelStatus `json:"levels"`
	// Waiting is the number of messages in all levels.
	Waiting int `json:"waiting"`
	// Missing is the number of level queues that do not exist (all of them when the levels
	// were never declared).
	Missing int `json:"missing"`
	// Unavailable is the number of level queues that exist and do not serve messages, which
	// only the management API tells: their messages are not counted in Waiting.
	Unavailable int `json:"unavailable"`
	// DeadLettering is the number of messages the levels are dead-lettering (management API
	// only; counted in Waiting).
	DeadLettering int `json:"dead_lettering"`
	// Parked is the number of messages in the parking queue (-1 if there is none), counted as
	// QueueStatus.Poison.
	Parked int `json:"parked"`
	// ParkingState is the parking queue's state, as QueueStatus.State.
	ParkingState string `json:"parking_state,omitempty"`
}

// Status is what Status returns.
type Status struct {
	Queues []QueueStatus `json:"queues"`
	Delay  DelayStatus   `json:"delay"`
	At     time.Time     `json:"at"`
	// ServerVersion is the RabbitMQ version of the broker connected to.
	ServerVersion string `json:"server_version"`
	// Warning is amqpx.DeadLetterWarning of ServerVersion: "" unless one malformed message
	// can stop dead-lettering on that version.
	Warning string `json:"warning,omitempty"`
	// Management tells whether the management API was asked (Config.Management): without
	// it, states, unacknowledged and dead-lettering messages and consumers' hosts are
	// unknown.
	Management bool `json:"management"`
	// Broker is what the management API tells of the broker's nodes, alarms and policies;
	// nil without it.
	Broker *Broker `json:"broker,omitempty"`
}

// Status reads the state of queues (work queues, by name) and of the delay levels, with the
// management API when Config.Management gives it.
func (o *Ops) Status(ctx context.Context, queues ...string) (Status, error) {
	s := Status{At: time.Now().UTC(), Management: o.mgmt != nil}
	err := o.call(ctx, "ops: status", func(ctx context.Context, _ *amqp.Channel) error {
		conn, err := o.connection(ctx)
		if err != nil {
			return err
		}
		s.ServerVersion = amqpx.ServerVersion(conn)
		s.Warning = amqpx.DeadLetterWarning(s.ServerVersion)
		s.Queues = make([]QueueStatus, len(queues))
		err = inspectAll(conn, len(queues), func(in *inspector, i int) (err error) {
			s.Queues[i], err = o.queueStatus(ctx, conn, in, queues[i])
			return err
		})
		if err != nil {
			return err
		}
		s.Delay, err = o.delayStatus(ctx, conn)
		return err
	})
	if err != nil {
		return s, err
	}
	if o.mgmt != nil {
		if err := o.addManagement(ctx, &s); err != nil {
			return s, fmt.Errorf("ops: status: %w", err)
		}
	}
	return s, nil
}

func (o *Ops) queueStatus(ctx context.Context, conn *amqp.Connection, in *inspector, name string) (QueueStatus, error) {
	s := QueueStatus{Queue: name, Poison: -1, Unacked: -1}
	q, ok, err := in.inspect(ctx, route{key: name})
	if err != nil || !ok {
		return s, err
	}
	s.Exists, s.Ready, s.Consumers = true, q.Messages, q.Consumers
	if p, ok, err := in.inspect(ctx, route{key: topology.PoisonQueue(name)}); err != nil {
		return s, err
	} else if ok {
		s.Poison = p.Messages
	}
	st, err := held.Read(ctx, conn, name) // empty, without a lock, when nothing was ever held
	if err != nil {
		return s, err
	}
	s.Held = len(st.Keys)
	c, found, err := kill.ReadState(ctx, conn, name, o.cfg.KillSecret)
	if err != nil {
		return s, err
	}
	if found {
		s.Kill, s.KillAt = c.Action, c.At
	}
	return s, nil
}

func (o *Ops) delayStatus(ctx context.Context, conn *amqp.Connection) (DelayStatus, error) {
	d := o.cfg.Delay
	s := DelayStatus{Name: d.Name(), Parked: -1}
	for p := range d.Levels {
		for digit := 1; digit < d.Radix; digit++ {
			s.Levels = append(s.Levels, LevelStatus{Queue: d.LevelQueue(p, digit), TTL: d.TTL(p, digit),
				DueWithin: d.TTL(p, digit) + d.TTL(p, 1) - d.Unit})
		}
	}
	levelsMax := d.Max() - time.Duration(d.Chain())*d.ChainTTL()
	for i := 1; i <= d.Chain(); i++ {
		s.Levels = append(s.Levels, LevelStatus{Queue: d.ChainQueue(i), TTL: d.ChainTTL(),
			DueWithin: time.Duration(i)*d.ChainTTL() + levelsMax})
	}
	parking := len(s.Levels) // the last one inspected
	var parked amqp.Queue
	var parkedOK bool
	err := inspectAll(conn, len(s.Levels)+1, func(in *inspector, i int) error {
		if i == parking {
			var err error
			parked, parkedOK, err = in.inspect(ctx, route{key: d.ParkingQueue()})
			return err
		}
		l := &s.Levels[i]
		q, ok, err := in.inspect(ctx, route{key: l.Queue})
		if err != nil {
			return fmt.Errorf("%s: %w", l.Queue, err)
		}
		l.Exists, l.Messages = ok, q.Messages
		return nil
	})
	if err != nil {
		return s, err
	}
	for _, l := range s.Levels {
		if !l.Exists {
			s.Missing++
		}
		s.Waiting += l.Messages
	}
	if parkedOK {
		s.Parked = parked.Messages
	}
	return s, nil
}

// statusWorkers is how many channels Status asks the broker on at once: each question is a
// round trip, and there are a few per work queue and one per delay level (120 by default).
const statusWorkers = 8

// inspectAll calls fn for 0..n-1 from up to statusWorkers goroutines, each with an inspector
// of its own on conn, and returns the first error.
func inspectAll(conn *amqp.Connection, n int, fn func(in *inspector, i int) error) error {
	next := make(chan int)
	errs := make(chan error, statusWorkers)
	var wg sync.WaitGroup
	for range min(n, statusWorkers) {
		wg.Go(func() {
			in := &inspector{conn: conn}
			defer in.close()
			for i := range next {
				if err := fn(in, i); err != nil {
					errs <- err
					for range next { // the others are not asked
					}
					return
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	return <-errs
}

// addManagement adds what the management API tells to s: the state, unacknowledged
// messages and consumers' hosts of each work queue that exists, the messages its poison
// queue holds unacknowledged too (a browse holds what it took: AMQP counts only the ready
// ones), the state and dead-lettering messages of each level, and the broker's nodes and
// policies (addBroker). A queue or level that does not serve messages counts no messages:
// the broker's 0 for it is no count.
func (o *Ops) addManagement(ctx context.Context, s *Status) error {
	ctx, cancel := context.WithTimeout(ctx, o.cfg.Timeout)
	defer cancel()
	for i := range s.Queues {
		q := &s.Queues[i]
		if !q.Exists {
			continue
		}
		m, found, err := o.mgmt.Queue(ctx, o.vhost, q.Queue)
		if err != nil {
			return err
		}
		if !found { // deleted since
			continue
		}
		q.State, q.Unacked, q.ConsumerHosts = m.Status(), m.Unacked, m.ConsumerHosts()
		if q.Unavailable() {
			q.Ready = 0
		}
	}
	all, err := o.mgmt.Queues(ctx, o.vhost)
	if err != nil {
		return err
	}
	byName := make(map[string]mgmt.Queue, len(all))
	for _, m := range all {
		byName[m.Name] = m
	}
	// The API's counts are statistics a few seconds old, AMQP's are of now and leave out the
	// messages held: the larger of the two counts both those held and those just come.
	for i := range s.Queues {
		if q := &s.Queues[i]; q.Poison >= 0 {
			q.Poison = max(q.Poison, byName[topology.PoisonQueue(q.Queue)].Messages)
		}
	}
	d := &s.Delay
	d.Waiting = 0
	for i := range d.Levels {
		l := &d.Levels[i]
		m, ok := byName[l.Queue]
		if !l.Exists || !ok {
			d.Waiting += l.Messages
			continue
		}
		l.State, l.DeadLettering = m.Status(), m.DeadLettering
		if l.Unavailable() {
			l.Messages, l.DeadLettering = 0, 0
			d.Unavailable++
		}
		l.Messages += l.DeadLettering
		d.DeadLettering += l.DeadLettering
		d.Waiting += l.Messages
	}
	if m, ok := byName[o.cfg.Delay.ParkingQueue()]; ok && d.Parked >= 0 {
		d.ParkingState, d.Parked = m.Status(), max(d.Parked, m.Messages)
	}
	return o.addBroker(ctx, s, byName)
}

// ErrNoManagement is returned by WorkQueues without Config.Management.
var ErrNoManagement = errors.New("ops: the management API is not given (Config.Management)")

// WorkQueues lists warren's work queues, by name, through the management API: the queues
// that dead-letter to their poison queue (x-dead-letter-exchange "" and
// x-dead-letter-routing-key the queue's name + ".poison"), as topology declares every work
// queue. It returns ErrNoManagement without Config.Management.
func (o *Ops) WorkQueues(ctx context.Context) ([]string, error) {
	if o.mgmt == nil {
		return nil, ErrNoManagement
	}
	ctx, cancel := context.WithTimeout(ctx, o.cfg.Timeout)
	defer cancel()
	all, err := o.mgmt.Queues(ctx, o.vhost)
	if err != nil {
		return nil, fmt.Errorf("ops: work queues: %w", err)
	}
	var names []string
	for _, q := range all {
		if isWorkQueue(q.Name, q.Arguments) {
			names = append(names, q.Name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// isWorkQueue reports whether a queue called name with arguments args is one of warren's
// work queues: it dead-letters to its poison queue through the default exchange.
func isWorkQueue(name string, args map[string]any) bool {
	x, hasX := args["x-dead-letter-exchange"].(string)
	key, _ := args["x-dead-letter-routing-key"].(string)
	return hasX && x == "" && key == topology.PoisonQueue(name)
}
