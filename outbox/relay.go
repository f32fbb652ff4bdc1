package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/telemetry"
	"github.com/warrenmq/warren/internal/visible"
)

// RelayConfig configures a Relay.
type RelayConfig struct {
	// Pool reaches the outbox's database (required). The relay opens one connection of its
	// own with the pool's connection settings: it holds the relay's lock and receives the
	// notifications of commits, and the relay reads and deletes rows on it.
	Pool *pgxpool.Pool
	// Publisher publishes the rows (required): a *dlx.Publisher, whose Publish returns nil
	// only once the broker has confirmed every message. Wrap it in
	// middleware.Tracing.Publisher to trace the relay's publishes as children of the
	// transactions that wrote them.
	Publisher message.Publisher
	// Schema holds the outbox's table, as for Config.Schema. Default DefaultSchema.
	Schema string
	// BatchSize is how many rows the relay reads, publishes and deletes at a time. Default
	// 256.
	BatchSize int
	// PollInterval is how often a relay looks for rows when no notification came (a
	// notification can be lost with a dropped connection), and how often a relay on
	// standby tries to take over. Default 1s.
	PollInterval time.Duration
	// Timeout bounds each database statement. Default 10s.
	Timeout time.Duration
	// MaxBackoff is the longest wait between two tries after a failure of the database or
	// the broker. Default 5s.
	MaxBackoff time.Duration
	// Propagator reads the trace context that Outbox.Publish wrote into the metadata. Default
	// propagation.TraceContext{}.
	Propagator propagation.TextMapPropagator
	// MeterProvider records the relay's metrics: warren.outbox.relayed, warren.outbox.set_aside
	// and warren.outbox.lag (see docs/metrics.md). Default: otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// Defaults of RelayConfig.
const (
	DefaultBatchSize    = 256
	DefaultPollInterval = time.Second
	DefaultTimeout      = 10 * time.Second
	DefaultMaxBackoff   = 5 * time.Second
)

// WithDefaults returns c with every unset field set to its default.
func (c RelayConfig) WithDefaults() RelayConfig {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	return c
}

// Validate reports the first field of c that is not usable.
func (c RelayConfig) Validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("outbox: RelayConfig.Pool is required")
	case c.Publisher == nil:
		return errors.New("outbox: RelayConfig.Publisher is required")
	case c.BatchSize < 0:
		return fmt.Errorf("outbox: RelayConfig.BatchSize %d is negative", c.BatchSize)
	}
	if err := validSchema(c.Schema); err != nil {
		return fmt.Errorf("outbox: RelayConfig.Schema: %w", err)
	}
	return notNegative("RelayConfig", field{"PollInterval", c.PollInterval}, field{"Timeout", c.Timeout},
		field{"MaxBackoff", c.MaxBackoff})
}

// Relay moves the messages that committed transactions wrote into the outbox to the
// broker, oldest first, and deletes each row once the broker has confirmed its message.
//
// Several relays may run against one outbox (one per process of a service, say): one holds
// the outbox's lock (a PostgreSQL advisory lock on its connection) and publishes, the
// others wait and take over within RelayConfig.PollInterval when its connection ends. The
// rows of one transaction are published in the order they were written.
//
// A relay killed between the broker's confirm and its delete publishes those rows again
// when it (or another) runs next: copies with the same publish id, which warren's
// subscriber recognises. A row the broker will never take (Publish fails with a
// warren.PermanentError: unroutable, too large, a delay beyond the levels' reach, a
// destination refused) is set aside with the reason and does not hold up the rows behind
// it. A database or broker that fails makes the relay back off, up to
// RelayConfig.MaxBackoff between tries, logging the failure once per try (see Run).
type Relay struct {
	cfg     RelayConfig
	table   string
	channel string
	logger  watermill.LoggerAdapter
	metrics *telemetry.Outbox
}

// NewRelay returns a relay for the outbox of config.Schema; Run starts it.
func NewRelay(config RelayConfig, logger watermill.LoggerAdapter) (*Relay, error) {
	config = config.WithDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	metrics, err := telemetry.NewOutbox(config.MeterProvider, config.Schema)
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return &Relay{
		cfg:     config,
		table:   table(config.Schema),
		channel: channel(config.Schema),
		logger:  logger.With(watermill.LogFields{"outbox": config.Schema}),
		metrics: metrics,
	}, nil
}

// Run relays until ctx ends, then returns nil. It returns an error only for a failure that
// trying again cannot cure (the outbox table does not exist: run Migrate).
//
// Each failure of the database or the broker is logged once, as it ends a try: at error
// level when it differs from the one before, at info level with a count while the same
// failure repeats (a database down for a minute logs one error and a few lines that say it
// still is).
func (r *Relay) Run(ctx context.Context) error {
	var log failureLog
	return amqpx.Reconnect(ctx, amqpx.Backoff{Initial: 100 * time.Millisecond, Max: r.cfg.MaxBackoff}, r.lead,
		func(err error, wait time.Duration) error {
			if isUndefinedTable(err) {
				return fmt.Errorf("outbox: relay: %w (run outbox.Migrate)", err)
			}
			log.failed(r.logger, err, wait)
			return nil
		})
}

// failureLog logs the relay's failures: a failure as an error, the same failure again at info
// level with a count.
type failureLog struct {
	last    string // the failure logged last
	repeats int
}

func (l *failureLog) failed(logger watermill.LoggerAdapter, err error, wait time.Duration) {
	if err.Error() == l.last {
		l.repeats++
		logger.Info("outbox: relay still failing, trying again", watermill.LogFields{"wait": wait.String(),
			"repeats": l.repeats, "error": visible.String(l.last)})
		return
	}
	l.last, l.repeats = err.Error(), 0
	logger.Error("outbox: relay failed, trying again", err, watermill.LogFields{"wait": wait.String()})
}

// isUndefinedTable tells whether err is PostgreSQL's "relation does not exist".
func isUndefinedTable(err error) bool {
	var pgErr interface{ SQLState() string }
	return errors.As(err, &pgErr) && pgErr.SQLState() == "42P01"
}

// lead connects, waits for the outbox's lock and relays until ctx ends or something fails;
// it calls steady once rows moved.
//
// The database's work overlaps the broker's: while a batch is in flight (published, its
// confirms awaited), the relay deletes the batch before it and reads the one after, in one
// statement. A batch is published only once the one before it is confirmed, so the broker
// gets the rows in the order they were read.
func (r *Relay) lead(ctx context.Context, steady func()) error {
	conn, err := r.connect(ctx)
	if err != nil {
		return err
	}
	var p pipeline
	defer r.release(ctx, conn, &p)
	if err := r.lock(ctx, conn); err != nil {
		return err
	}
	r.logger.Info("outbox: relay holds the outbox", nil)
	if _, err := r.exec(ctx, conn, "LISTEN "+pgx.Identifier{r.channel}.Sanitize()); err != nil {
		return err
	}
	for {
		batch, err := r.read(ctx, conn, p.gone, p.flying)
		if err != nil {
			return err
		}
		if p.gone != nil {
			r.metrics.Relayed(ctx, p.gone.written(), p.gone.at)
			p.gone = nil
		}
		if p.flying != nil {
			if err := r.land(ctx, conn, &p); err != nil {
				return err // release deletes what was confirmed
			}
			steady()
		}
		if len(batch) > 0 {
			p.flying = r.fly(ctx, batch)
			continue
		}
		if p.gone != nil {
			continue // the next read deletes it, and finds what came meanwhile
		}
		if err := r.awaitRows(ctx, conn); err != nil {
			return err
		}
	}
}

// pipeline is the lead's batches between the database and the broker.
type pipeline struct {
	flying *flight // the batch in flight
	gone   *flight // the batch confirmed last, to delete
}

// connect opens the relay's connection to the database: the pool's settings, named for
// ReadStats, with keepalives and planner settings of its own.
func (r *Relay) connect(ctx context.Context) (*pgx.Conn, error) {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	cfg := r.cfg.Pool.Config().ConnConfig.Copy()
	cfg.RuntimeParams["application_name"] = relayApplicationName(r.cfg.Schema) // ReadStats counts relays by it
	// The server probes the connection after 10 s of silence, every 5 s, 3 times: a relay
	// cut off from the database (a network gone, not a closed socket) loses the lock in
	// about 25 s, instead of the system's default of hours, and another relay takes over.
	cfg.RuntimeParams["tcp_keepalives_idle"] = "10"
	cfg.RuntimeParams["tcp_keepalives_interval"] = "5"
	cfg.RuntimeParams["tcp_keepalives_count"] = "3"
	// The relay's statements (its read of the oldest rows, its deletes and set-asides by id)
	// are best served by the outbox's indexes whatever the table's statistics say: after a
	// burst of writes that autovacuum has not analysed yet, PostgreSQL would otherwise read
	// and sort the whole backlog for every batch. A custom plan lets it hash the list of ids
	// the read leaves out (docs/decisions.md).
	cfg.RuntimeParams["enable_bitmapscan"] = "off"
	cfg.RuntimeParams["enable_seqscan"] = "off"
	cfg.RuntimeParams["plan_cache_mode"] = "force_custom_plan"
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return conn, nil
}

// release ends a lead: what the broker confirmed goes, if the connection still works, even
// when ctx ended (a relay that stops leaves no copies to send), and the connection is closed,
// which releases the lock.
func (r *Relay) release(ctx context.Context, conn *pgx.Conn, p *pipeline) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Timeout)
	defer cancel()
	if p.flying != nil {
		<-p.flying.done
	}
	for _, f := range []*flight{p.gone, p.flying} {
		if f != nil && len(f.confirmed) > 0 {
			if _, err := conn.Exec(dctx, "DELETE FROM "+r.table+" WHERE id = ANY($1)", f.ids()); err == nil {
				r.metrics.Relayed(ctx, f.written(), f.at)
			}
		}
	}
	_ = conn.Close(dctx)
}

// land waits for the batch in flight, sets aside the rows the broker will never take, and
// makes it the batch to delete; it returns the flight's failure, if any (the rows after the
// failed one wait for the next lead).
func (r *Relay) land(ctx context.Context, conn *pgx.Conn, p *pipeline) error {
	f := p.flying
	<-f.done
	p.flying = nil
	for _, a := range f.aside {
		if err := r.setAside(ctx, conn, a.id, a.reason); err != nil {
			return err
		}
	}
	p.gone = f
	return f.err
}

// awaitRows waits for a notification of a commit, or PollInterval, whichever comes first.
func (r *Relay) awaitRows(ctx context.Context, conn *pgx.Conn) error {
	wctx, cancel := context.WithTimeout(ctx, r.cfg.PollInterval)
	_, err := conn.WaitForNotification(wctx)
	cancel()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("wait for a notification: %w", err)
	}
	return nil
}

// lock waits until conn holds the outbox's advisory lock (another relay may hold it),
// trying every PollInterval.
func (r *Relay) lock(ctx context.Context, conn *pgx.Conn) error {
	for {
		var got bool
		cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
		err := conn.QueryRow(cctx, "SELECT pg_try_advisory_lock($1)", lockKey(r.cfg.Schema)).Scan(&got)
		cancel()
		if err != nil {
			return fmt.Errorf("take the outbox's lock: %w", err)
		}
		if got {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(r.cfg.PollInterval):
		}
	}
}

func (r *Relay) exec(ctx context.Context, conn *pgx.Conn, sql string, args ...any) (int64, error) {
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	tag, err := conn.Exec(cctx, sql, args...)
	return tag.RowsAffected(), err
}

// row is a message of the outbox.
type row struct {
	id        int64
	topic     []byte
	uuid      []byte
	payload   []byte
	metadata  []byte
	publishID string
	due       *time.Time
	written   time.Time
}

// read deletes the rows of gone that the broker confirmed and reads the oldest waiting rows
// (up to BatchSize) other than those and the rows in flight, in one statement: the delete
// is not visible to the read of the same statement.
func (r *Relay) read(ctx context.Context, conn *pgx.Conn, gone, flying *flight) ([]row, error) {
	del, skip := []int64{}, []int64{} // not nil: id <> ALL(NULL) is never true
	if gone != nil {
		del = gone.ids()
		skip = del
	}
	if flying != nil {
		for _, w := range flying.rows {
			skip = append(skip, w.id)
		}
	}
	cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	rows, err := conn.Query(cctx, "WITH gone AS (DELETE FROM "+r.table+" WHERE id = ANY($1)) "+
		"SELECT id, topic, uuid, payload, metadata, publish_id, due, written FROM "+r.table+
		" WHERE set_aside IS NULL AND id <> ALL($2) ORDER BY id LIMIT $3", del, skip, r.cfg.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("read the outbox: %w", err)
	}
	batch, err := pgx.CollectRows(rows, func(c pgx.CollectableRow) (row, error) {
		var w row
		err := c.Scan(&w.id, &w.topic, &w.uuid, &w.payload, &w.metadata, &w.publishID, &w.due, &w.written)
		return w, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the outbox: %w", err)
	}
	return batch, nil
}

// setAside marks the row id as one the broker will never take, with the reason.
func (r *Relay) setAside(ctx context.Context, conn *pgx.Conn, id int64, reason error) error {
	r.logger.Error("outbox: a message is set aside", reason, watermill.LogFields{"row": id})
	if _, err := r.exec(ctx, conn, "UPDATE "+r.table+" SET set_aside = now(), reason = $2 WHERE id = $1",
		id, visible.String(reason.Error())); err != nil { // text holds valid UTF-8, no NUL
		return fmt.Errorf("set row %d aside: %w", id, err)
	}
	r.metrics.SetAside(ctx)
	return nil
}
