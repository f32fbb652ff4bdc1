package scheduler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/topology"
)

// Job is a message published on a schedule.
type Job struct {
	// Name identifies the job within its Scheduler: it is part of every tick's message id
	// and of the state. Required.
	Name string
	// Schedule is a cron expression: five fields (minute hour day-of-month month
	// day-of-week), or @yearly, @monthly, @weekly, @daily, @hourly; a CRON_TZ=Zone prefix
	// gives it a time zone of its own. Or @every D, a whole number of seconds: ticks on the
	// multiples of D since the Unix epoch (@every 10s ticks at :00, :10, :20, ...). Required.
	Schedule string
	// Topic is where each tick is published, through the Publisher's route. Required.
	Topic string
	// Payload and Metadata are copied into every tick's message.
	Payload  []byte
	Metadata map[string]string
}

// Missed says what becomes of the ticks whose time passed before a scheduler of the group
// published them: while none ran, or while the active one came late to them (a loaded
// machine, a slow broker).
type Missed string

const (
	// CatchUp publishes every missed tick at once (the latest MaxCatchUp of them), each with
	// the message id it would have had.
	CatchUp Missed = "catch-up"
	// Skip publishes none of them: the job goes on with its next tick.
	Skip Missed = "skip"
)

// Config configures a Scheduler.
type Config struct {
	// Connection says how to reach the broker (URL required).
	Connection warren.Connection
	// Topology holds the delay levels that hold each job's next tick until it is due.
	Topology topology.Config
	// Name of the group of schedulers, of which one is active at a time: every process that
	// runs a Scheduler with the same Name (and Prefix) shares its lock and its state.
	// Default "default".
	Name string
	// Prefix starts the names of the group's lock and state queues. Default
	// "warren.scheduler".
	Prefix string
	// Jobs to run. Required; names unique.
	Jobs []Job
	// Location is the time zone of the cron expressions that name none. Default UTC.
	Location *time.Location
	// Missed is the policy for missed ticks: published late (CatchUp) or skipped (Skip).
	// Default CatchUp.
	Missed Missed
	// MaxCatchUp bounds the missed ticks CatchUp publishes per job. Default 100.
	MaxCatchUp int
	// Timeout bounds each broker call of the active scheduler (reading or writing its
	// state). Default 30s.
	Timeout time.Duration
}

// Defaults of Config.
const (
	DefaultName       = "default"
	DefaultPrefix     = "warren.scheduler"
	DefaultMaxCatchUp = 100
	DefaultTimeout    = 30 * time.Second
)

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	c.Connection = c.Connection.WithDefaults()
	c.Topology = c.Topology.WithDefaults()
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.Location == nil {
		c.Location = time.UTC
	}
	if c.Missed == "" {
		c.Missed = CatchUp
	}
	if c.MaxCatchUp == 0 {
		c.MaxCatchUp = DefaultMaxCatchUp
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	return c
}

// Validate reports the first field of c (with defaults applied) that is not usable.
func (c Config) Validate() error {
	c = c.WithDefaults()
	if err := c.Connection.Validate(); err != nil {
		return fmt.Errorf("scheduler: Config.%w", err)
	}
	if err := c.Topology.Validate(); err != nil {
		return fmt.Errorf("scheduler: Config.Topology: %w", err)
	}
	switch {
	case c.Missed != CatchUp && c.Missed != Skip:
		return fmt.Errorf("scheduler: Config.Missed %q is neither %q nor %q", c.Missed, CatchUp, Skip)
	case c.MaxCatchUp < 0:
		return fmt.Errorf("scheduler: Config.MaxCatchUp %d is negative", c.MaxCatchUp)
	case c.Timeout < 0:
		return fmt.Errorf("scheduler: Config.Timeout %s is negative", c.Timeout)
	case len(c.Jobs) == 0:
		return errors.New("scheduler: Config.Jobs is empty")
	case strings.HasPrefix(c.Prefix, "amq."):
		return fmt.Errorf("scheduler: Config.Prefix %q: names starting with amq. are reserved", c.Prefix)
	}
	seen := map[string]bool{}
	for i, j := range c.Jobs {
		switch {
		case j.Name == "":
			return fmt.Errorf("scheduler: Config.Jobs[%d].Name is empty", i)
		case seen[j.Name]:
			return fmt.Errorf("scheduler: Config.Jobs[%d].Name %q is used twice", i, j.Name)
		case j.Topic == "":
			return fmt.Errorf("scheduler: Config.Jobs[%d].Topic is empty", i)
		}
		seen[j.Name] = true
		if _, err := parseSpec(j.Schedule, c.Location); err != nil {
			return fmt.Errorf("scheduler: Config.Jobs[%d].Schedule %w", i, err)
		}
	}
	return nil
}

// LockQueue is the queue whose single active consumer is the group's active scheduler.
func LockQueue(prefix, name string) string { return prefix + "." + name + ".lock" }

// StateQueue is the queue that holds the group's state: each job's latest scheduled tick.
func StateQueue(prefix, name string) string { return prefix + "." + name + ".state" }

// Metadata that every tick's message carries.
const (
	// MetadataJob is "group/job".
	MetadataJob = "warren_scheduler_job"
	// MetadataTick is the tick's time, RFC 3339 with nanoseconds, UTC.
	MetadataTick = "warren_scheduler_tick"
)

// TickID is the message id of job's tick at t in group name: the same in every process, so
// that a tick published twice (by a scheduler killed before it recorded the tick, and its
// successor) is one message id, which middleware.MessageIDKey handles once.
func TickID(name, job string, t time.Time) string {
	return name + "/" + job + "/" + t.UTC().Format(time.RFC3339Nano)
}

// Scheduler publishes the ticks of its jobs while it is the active scheduler of its group.
//
// Every Scheduler of a group consumes the group's lock queue, a quorum queue with a single
// active consumer that holds a token message: the consumer the broker delivers it to is
// the active scheduler. When its connection ends (the process killed, the network lost),
// the broker gives the token to the next consumer, within milliseconds of noticing.
//
// The active scheduler keeps each job's next tick published ahead of time: as a message
// delayed until the tick (through the delay levels, on time to the delay levels' precision,
// whether or not a scheduler runs then), and publishes the tick after it once that one is
// due. It records the latest tick it published in the state queue, so that its successor
// goes on from there: ticks missed while no scheduler ran are published (CatchUp) or
// skipped (Skip); a tick published twice (a scheduler killed after publishing it and
// before recording it) has the same message id both times (TickID).
type Scheduler struct {
	cfg    Config
	logger watermill.LoggerAdapter
	specs  map[string]spec
	pub    *dlx.Publisher
	dialer *amqpx.Dialer // the lock's connection

	active  atomic.Bool
	mu      sync.Mutex
	cancel  context.CancelFunc
	running chan struct{}
	closed  bool
}

// New returns a Scheduler, or an error naming the first invalid field of config. It
// declares the delay levels (through its publisher) at once.
func New(config Config, logger watermill.LoggerAdapter) (*Scheduler, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config = config.WithDefaults()
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	s := &Scheduler{cfg: config, logger: logger.With(watermill.LogFields{"scheduler": config.Name}), specs: map[string]spec{}}
	// Run logs each lost connection itself, and OnEvent is told of it.
	s.dialer = amqpx.NewDialer(config.Connection, "warren scheduler "+config.Name, s.logger).OwnerReportsLoss()
	for _, j := range config.Jobs {
		s.specs[j.Name], _ = parseSpec(j.Schedule, config.Location)
	}
	pub, err := dlx.NewPublisher(dlx.Config{Connection: config.Connection, Topology: config.Topology}, logger)
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	s.pub = pub
	return s, nil
}

// Active reports whether this Scheduler is its group's active one now.
func (s *Scheduler) Active() bool { return s.active.Load() }

// Run takes part in the group until ctx ends or Close is called: it waits to become the
// active scheduler, publishes ticks while it is, and connects again when its connection is
// lost. It returns nil then, or ErrClosed if called after Close.
func (s *Scheduler) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return warren.ErrClosed
	}
	if s.running != nil {
		s.mu.Unlock()
		return errors.New("scheduler: Run called twice")
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.running = make(chan struct{})
	s.mu.Unlock()
	defer close(s.running)

	_ = amqpx.Reconnect(ctx, amqpx.HeldConnection, func(ctx context.Context, _ func()) error { return s.session(ctx) },
		amqpx.LogEach(s.logger, "Scheduler lost its connection; connecting again", nil))
	return nil
}

// Close stops Run, if it runs, and closes the publisher. A tick already published stays
// published: it is delivered when it is due.
func (s *Scheduler) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	cancel, running := s.cancel, s.running
	s.mu.Unlock()
	if cancel != nil {
		cancel()
		<-running
	}
	return s.pub.Close()
}

// session connects, joins the group and leads it while the broker says so, until the
// connection is lost or ctx ends.
func (s *Scheduler) session(ctx context.Context) error {
	conn, err := s.dialer.Dial(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = amqpx.Close(conn) }()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	deliveries, err := s.join(ctx, conn)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-closed:
		return fmt.Errorf("scheduler: connection closed: %w", err)
	case _, ok := <-deliveries: // the token: held, never acked; the broker hands it on when this connection ends
		if !ok {
			return errors.New("scheduler: the broker cancelled the lock queue's consumer")
		}
	}

	s.active.Store(true)
	defer s.active.Store(false)
	s.logger.Info("Scheduler is active", nil)
	lead, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- s.lead(lead, conn) }()
	// Whatever ends the term first is the reason; the lead's own error, once stopped, is not.
	end := func() {
		stop()
		if err := <-done; err != nil {
			s.logger.Debug("Scheduler's term ended", watermill.LogFields{"err": err})
		}
	}
	select {
	case <-ctx.Done():
		end()
		return nil
	case err := <-closed:
		end()
		return fmt.Errorf("scheduler: connection closed: %w", err)
	case <-deliveries: // closed: the consumer was cancelled
		end()
		return errors.New("scheduler: the broker cancelled the lock queue's consumer")
	case err := <-done:
		return err // closing the connection hands the token on
	}
}

// lockArgs declare the lock queue: a quorum queue with a single active consumer. Every
// process that joins publishes a token, so that one exists once anybody has joined; the
// length limit keeps the spare tokens to one or two (the token a consumer holds does not
// count), and a token handed back by a closed connection is not dropped for a delivery
// limit.
var lockArgs = amqp.Table{
	amqp.QueueTypeArg:          amqp.QueueTypeQuorum,
	"x-single-active-consumer": true,
	"x-max-length":             int64(1),
	"x-overflow":               "drop-head",
	"x-delivery-limit":         int64(1<<31 - 1),
}

// stateArgs declare the state queue: quorum, one or two messages (the newest is read), and
// no delivery limit (reading returns the message).
var stateArgs = amqp.Table{
	amqp.QueueTypeArg:  amqp.QueueTypeQuorum,
	"x-max-length":     int64(1),
	"x-overflow":       "drop-head",
	"x-delivery-limit": int64(1<<31 - 1),
}

// join declares the group's queues, publishes a token and consumes the lock queue, one
// message at a time.
func (s *Scheduler) join(ctx context.Context, conn *amqp.Connection) (<-chan amqp.Delivery, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	lock, state := LockQueue(s.cfg.Prefix, s.cfg.Name), StateQueue(s.cfg.Prefix, s.cfg.Name)
	ch, err := conn.Channel()
	if err != nil {
		return nil, err
	}
	var deliveries <-chan amqp.Delivery
	err = amqpx.Do(ctx, ch, func() error {
		if _, err := ch.QueueDeclare(lock, true, false, false, false, lockArgs); err != nil {
			return fmt.Errorf("declare %s: %w", lock, err)
		}
		if _, err := ch.QueueDeclare(state, true, false, false, false, stateArgs); err != nil {
			return fmt.Errorf("declare %s: %w", state, err)
		}
		if err := amqpx.PublishConfirmed(ctx, ch, "", lock, true, amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("token")}); err != nil {
			return fmt.Errorf("publish a token to %s: %w", lock, err)
		}
		if err := ch.Qos(1, 0, false); err != nil {
			return err
		}
		var err error
		deliveries, err = ch.Consume(lock, "", false, false, false, false, nil)
		return err
	})
	if err != nil {
		_ = ch.Close()
		return nil, fmt.Errorf("scheduler: join %s: %w", s.cfg.Name, err)
	}
	return deliveries, nil
}

// lead publishes the jobs' ticks until ctx ends or a broker call fails.
func (s *Scheduler) lead(ctx context.Context, conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer func() { _ = ch.Close() }()
	st, err := s.readState(ctx, ch)
	if err != nil {
		return err
	}
	conf, err := amqpx.NewConfirmer(ch)
	if err != nil {
		return err
	}
	// A round, once begun, ends: what it publishes it records, even when the term ends
	// meanwhile (Close), so that a successor need not publish it again. Each of its calls
	// has a time limit of its own.
	round := context.WithoutCancel(ctx)
	timer := time.NewTimer(time.Hour) // reset before each wait
	defer timer.Stop()
	for ctx.Err() == nil {
		now := time.Now()
		// At least hourly: a timer counts the monotonic clock, which a wall clock set forward,
		// or a machine suspended, does not move, while ticks are wall-clock times.
		wake, changed := now.Add(time.Hour), false
		for _, j := range s.cfg.Jobs {
			js, ok := st.Jobs[j.Name]
			sp := s.specs[j.Name]
			// New, changed, or recorded more than a tick ahead of this clock (a clock ahead,
			// or a forged state, would stop the job until then): from now on.
			if !ok || js.Schedule != j.Schedule || js.Topic != j.Topic || js.Next.After(sp.Next(sp.Next(now))) {
				js = JobState{Schedule: j.Schedule, Topic: j.Topic}
			}
			if !js.Next.After(now) {
				if err := s.advance(round, conn, j, &js, now); err != nil {
					return err
				}
				st.Jobs[j.Name], changed = js, true
			}
			if js.Next.Before(wake) {
				wake = js.Next
			}
		}
		if changed {
			if err := s.writeState(round, conf, st); err != nil {
				return err
			}
		}
		timer.Reset(time.Until(wake))
		select {
		case <-ctx.Done():
		case <-timer.C:
		}
	}
	return nil
}

// advance publishes job j's missed ticks after js.Next (by policy), and its next tick
// after now, delayed until it is due; js.Next becomes that tick. It stops once the lock's
// connection is lost: another scheduler is active then, or soon.
func (s *Scheduler) advance(ctx context.Context, lock *amqp.Connection, j Job, js *JobState, now time.Time) error {
	sp := s.specs[j.Name]
	var ticks []time.Time // to publish: the missed ones, then the next
	if !js.Next.IsZero() {
		missed, more := between(sp, js.Next, now, s.cfg.MaxCatchUp)
		if s.cfg.Missed == Skip {
			more += len(missed)
			missed = nil
		}
		if more > 0 {
			s.logger.Info("Scheduler skips missed ticks", watermill.LogFields{"job": j.Name, "skipped": more, "policy": s.cfg.Missed})
		}
		ticks = missed
		js.Missed += more
	}
	next := sp.Next(now)
	if !next.IsZero() {
		ticks = append(ticks, next)
	}
	for _, t := range ticks {
		if lock.IsClosed() {
			return amqp.ErrClosed
		}
		if err := s.publish(ctx, j, t); err != nil {
			return err
		}
	}
	js.Next = next
	if next.IsZero() {
		js.Next = now.Add(24 * time.Hour) // a cron expression that never matches: look again tomorrow
	}
	return nil
}

// publish publishes job j's tick at t: delayed until t, or at once if t has come (a tick
// whose catch-up or retries took until after it).
func (s *Scheduler) publish(ctx context.Context, j Job, t time.Time) error {
	msg := message.NewMessage(TickID(s.cfg.Name, j.Name, t), j.Payload)
	msg.SetContext(ctx)
	for k, v := range j.Metadata {
		msg.Metadata.Set(k, v)
	}
	msg.Metadata.Set(MetadataJob, s.cfg.Name+"/"+j.Name)
	msg.Metadata.Set(MetadataTick, t.UTC().Format(time.RFC3339Nano))
	if t.After(time.Now()) {
		warren.DeliverAt(msg, t)
	}
	err := s.pub.Publish(j.Topic, msg)
	if warren.IsPermanent(err) {
		// Publishing it again cannot succeed (a return, a refusal): the next tick may.
		s.logger.Error("Scheduler cannot publish a tick; it is missed", err, watermill.LogFields{"job": j.Name, "tick": msg.UUID})
		return nil
	}
	if err != nil {
		return fmt.Errorf("scheduler: publish tick %s: %w", msg.UUID, err)
	}
	return nil
}
