package outbox

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/middleware"
)

// InboxConfig configures an Inbox.
type InboxConfig struct {
	// Pool reaches the database (required): the handler's transaction is one of its.
	Pool *pgxpool.Pool
	// Schema holds the inbox's table, beside the outbox's (Migrate creates both). Default
	// DefaultSchema.
	Schema string
	// Key names a message in the inbox. Default middleware.MessageIDKey: the queue it was
	// consumed from and its id, which every copy, redelivery and retry of it keeps (an
	// outbox row relayed twice too). A message whose key is "" is handled in a transaction,
	// without an inbox record.
	Key func(*message.Message) string
	// OutputTopic is where the messages the handler returns are published, through the
	// outbox in the handler's transaction. A handler that returns messages without it fails
	// permanently (poisoned, nothing committed): published by the router after the commit,
	// they could be lost to a retry that finds the message handled.
	OutputTopic string
	// Retention is how long a key is kept: a copy that arrives later runs its handler
	// again. Default 7 days.
	Retention time.Duration
	// ExpireEvery is how often the middleware starts, in the background, the deletion of
	// keys past the retention (at most one at a time). Default 1 minute.
	ExpireEvery time.Duration
	// Timeout bounds the inbox's own statements (begin, record, commit). A database that
	// cannot be reached when the transaction begins is tried again, backing off, for up to
	// Timeout before the attempt fails: a shorter outage only holds the handlers up. Default
	// 10s.
	Timeout time.Duration
}

// Defaults of InboxConfig.
const (
	DefaultRetention   = 7 * 24 * time.Hour
	DefaultExpireEvery = time.Minute
)

// WithDefaults returns c with every unset field set to its default.
func (c InboxConfig) WithDefaults() InboxConfig {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.Key == nil {
		c.Key = middleware.MessageIDKey
	}
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.ExpireEvery == 0 {
		c.ExpireEvery = DefaultExpireEvery
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	return c
}

// Validate reports the first field of c that is not usable.
func (c InboxConfig) Validate() error {
	if c.Pool == nil {
		return errors.New("outbox: InboxConfig.Pool is required")
	}
	if err := validSchema(c.Schema); err != nil {
		return fmt.Errorf("outbox: InboxConfig.Schema: %w", err)
	}
	return notNegative("InboxConfig", field{"Retention", c.Retention}, field{"ExpireEvery", c.ExpireEvery},
		field{"Timeout", c.Timeout})
}

// Inbox runs a handler inside a PostgreSQL transaction that also records the message's key,
// so that "consume, write, publish" takes effect once: the handler's writes (through
// TxFrom), its key and its output (through the outbox) commit together, and a copy or
// redelivery of a message whose transaction committed is acked without running the handler.
//
// Put Middleware around the handler (router.HandlerConfig.Middleware, inside Backoff and
// Poison): a handler that fails rolls everything back and is retried on its schedule.
type Inbox struct {
	cfg    InboxConfig
	table  string
	box    *Outbox
	logger watermill.LoggerAdapter

	expiring   atomic.Bool
	lastExpiry atomic.Int64 // unix nanoseconds of the last start
	wg         sync.WaitGroup
	closed     atomic.Bool
}

// NewInbox returns an Inbox on the table of config.Schema (Migrate creates it). Close it
// when the router has stopped.
func NewInbox(config InboxConfig, logger watermill.LoggerAdapter) (*Inbox, error) {
	config = config.WithDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	box, err := New(Config{Schema: config.Schema}, logger)
	if err != nil {
		return nil, err
	}
	i := &Inbox{cfg: config, table: inboxTable(config.Schema), box: box,
		logger: logger.With(watermill.LogFields{"inbox": config.Schema})}
	i.lastExpiry.Store(time.Now().UnixNano())
	return i, nil
}

type txKey struct{}

// TxFrom returns the transaction an Inbox runs the handler in, from the message's context
// (msg.Context()); false outside an Inbox.
func TxFrom(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// Outbox is the outbox of the inbox's schema: publish with it through TxFrom's transaction
// to send a message with the handler's effects.
func (i *Inbox) Outbox() *Outbox { return i.box }

// Middleware runs h in a transaction; see Inbox.
func (i *Inbox) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		i.maybeExpire()
		ctx := msg.Context()
		tx, release, err := i.begin(ctx, i.cfg.Key(msg))
		if errors.Is(err, errHandled) {
			i.logger.Debug("outbox: inbox: handled already, acked", watermill.LogFields{"message_uuid": msg.UUID})
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		// Rolled back unless committed; a rollback after the commit does nothing.
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), i.cfg.Timeout)
			defer cancel()
			_ = tx.Rollback(rctx)
			release()
		}()
		msg.SetContext(context.WithValue(ctx, txKey{}, tx))
		out, err := h(msg)
		msg.SetContext(ctx)
		if err != nil {
			return nil, err
		}
		if len(out) > 0 {
			if i.cfg.OutputTopic == "" {
				return nil, warren.Permanent(fmt.Errorf("outbox: inbox: the handler returned %d message(s) and InboxConfig.OutputTopic is empty", len(out)))
			}
			if err := i.box.Publish(ctx, tx, i.cfg.OutputTopic, out...); err != nil {
				return nil, err
			}
		}
		cctx, cancel := context.WithTimeout(ctx, i.cfg.Timeout)
		defer cancel()
		if err := tx.Commit(cctx); err != nil {
			// The commit may have happened: the retry then finds the key and acks.
			return nil, fmt.Errorf("outbox: inbox: commit: %w", err)
		}
		return nil, nil
	}
}

// errHandled says that the inbox holds the message's key: a transaction that handled it
// committed.
var errHandled = errors.New("outbox: inbox: handled already")

// begin begins the handler's transaction and records key in it (see beginOnce). A database
// it cannot reach (down, restarting, a connection cut) it tries again, backing off, for up
// to InboxConfig.Timeout: an outage shorter than that holds the handler up instead of
// spending the message's attempt.
func (i *Inbox) begin(ctx context.Context, key string) (tx pgx.Tx, release func(), err error) {
	bctx, cancel := context.WithTimeout(ctx, i.cfg.Timeout)
	defer cancel()
	// err holds the last try's error, which is what to report.
	_ = amqpx.Reconnect(bctx, amqpx.Backoff{Initial: 50 * time.Millisecond, Max: time.Second},
		func(ctx context.Context, _ func()) error {
			tx, release, err = i.beginOnce(ctx, key)
			return err
		},
		func(err error, _ time.Duration) error {
			if !unreachable(err) {
				return err // refused: trying again cannot help
			}
			return nil
		})
	return tx, release, err
}

// unreachable tells whether err says that the database could not be reached or went away,
// rather than that it refused the statement: a failed connect, a connection that broke,
// a server shutting down or starting up (SQLSTATE classes 08 and 57P).
func unreachable(err error) bool {
	if errors.Is(err, errHandled) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08") || strings.HasPrefix(pgErr.Code, "57P")
	}
	return true
}

// beginOnce begins the handler's transaction on a connection of the pool and records key in
// it (unless key is ""), in one round trip: BEGIN and the INSERT go as one query. A key that
// is there already fails the INSERT, which beginOnce rolls back and reports as errHandled; a
// transaction that holds the same key and has not ended makes the INSERT wait for its end.
// release gives the connection back, after the transaction's end.
func (i *Inbox) beginOnce(ctx context.Context, key string) (tx pgx.Tx, release func(), err error) {
	conn, err := i.cfg.Pool.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("outbox: inbox: begin: %w", err)
	}
	begin := "BEGIN"
	if key != "" {
		// The key as hex digits: a literal that cannot end early, whatever bytes it holds.
		begin += "; INSERT INTO " + i.table + " (key) VALUES (decode('" + hex.EncodeToString([]byte(key)) + "', 'hex'))"
	}
	tx, err = conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: begin})
	if err == nil {
		return tx, conn.Release, nil
	}
	defer conn.Release() // a connection left in a transaction is closed, not reused
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" { // unique_violation
		if _, err := conn.Exec(ctx, "ROLLBACK"); err != nil {
			return nil, nil, fmt.Errorf("outbox: inbox: roll back after finding the message's key: %w", err)
		}
		return nil, nil, errHandled
	}
	return nil, nil, fmt.Errorf("outbox: inbox: begin and record the message: %w", err)
}

// maybeExpire starts Expire in the background when ExpireEvery has passed since the last
// start and none runs.
func (i *Inbox) maybeExpire() {
	last := i.lastExpiry.Load()
	if time.Since(time.Unix(0, last)) < i.cfg.ExpireEvery || i.closed.Load() ||
		!i.lastExpiry.CompareAndSwap(last, time.Now().UnixNano()) || !i.expiring.CompareAndSwap(false, true) {
		return
	}
	i.wg.Go(func() {
		defer i.expiring.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 10*i.cfg.Timeout)
		defer cancel()
		if _, err := i.Expire(ctx); err != nil {
			i.logger.Error("outbox: inbox: expire keys", err, nil)
		}
	})
}

// expireBatch is how many keys one statement of Expire deletes: short statements that hold
// few locks.
const expireBatch = 10_000

// Expire deletes the keys older than InboxConfig.Retention, a batch at a time, and returns
// how many it deleted. The middleware runs it every InboxConfig.ExpireEvery.
func (i *Inbox) Expire(ctx context.Context) (int64, error) {
	var total int64
	for {
		sctx, cancel := context.WithTimeout(ctx, i.cfg.Timeout)
		tag, err := i.cfg.Pool.Exec(sctx, "DELETE FROM "+i.table+" WHERE key IN (SELECT key FROM "+i.table+
			" WHERE handled < now() - $1 * interval '1 microsecond' LIMIT $2)", i.cfg.Retention.Microseconds(), expireBatch)
		cancel()
		if err != nil {
			return total, fmt.Errorf("outbox: inbox: expire: %w", err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < expireBatch {
			return total, nil
		}
	}
}

// Close waits for a background expiry to end; the middleware starts none after it.
func (i *Inbox) Close() error {
	i.closed.Store(true)
	i.wg.Wait()
	return nil
}
