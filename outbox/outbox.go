package outbox

import (
	"context"
	_ "embed"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/due"
)

// DefaultSchema is the PostgreSQL schema of the outbox's table unless Config.Schema names
// another.
const DefaultSchema = "warren"

// Execer runs a statement: a pgx.Tx (the caller's transaction, the usual case), a *pgx.Conn,
// a *pgxpool.Pool or a *pgxpool.Conn.
type Execer interface {
	Exec(ctx context.Context, sql string, arguments ...any) (pgconn.CommandTag, error)
}

// Config configures an Outbox.
type Config struct {
	// Schema is the PostgreSQL schema that holds the outbox's table (created by Migrate).
	// Default DefaultSchema.
	Schema string
	// Propagator writes the trace context of Publish's context into each message's
	// metadata, so that the relay's publish and the handler continue the trace of the
	// transaction that wrote the message. Default propagation.TraceContext{} (W3C
	// traceparent), as middleware.Tracing reads it.
	Propagator propagation.TextMapPropagator
	// PastTolerance is how far in the past a DeliverAt time may lie when Publish is called
	// (the message is then published at once) before it is an error, as for
	// dlx.Config.PastTolerance. Default 1s, dlx.DefaultPastTolerance.
	PastTolerance time.Duration
}

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	if c.Schema == "" {
		c.Schema = DefaultSchema
	}
	if c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	if c.PastTolerance == 0 {
		c.PastTolerance = due.DefaultPastTolerance
	}
	return c
}

// Validate reports the first field of c that is not usable.
func (c Config) Validate() error {
	if err := validSchema(c.Schema); err != nil {
		return fmt.Errorf("outbox: Config.Schema: %w", err)
	}
	return notNegative("Config", field{"PastTolerance", c.PastTolerance})
}

// field is a duration field of a config, by name, for notNegative.
type field struct {
	name string
	d    time.Duration
}

// notNegative reports the first of fields that is negative, as a field of config.
func notNegative(config string, fields ...field) error {
	for _, f := range fields {
		if f.d < 0 {
			return fmt.Errorf("outbox: %s.%s %s is negative", config, f.name, f.d)
		}
	}
	return nil
}

// schemaOr returns schema, DefaultSchema if it is "", or an error if PostgreSQL would not
// take it as it is.
func schemaOr(schema string) (string, error) {
	if schema == "" {
		schema = DefaultSchema
	}
	if err := validSchema(schema); err != nil {
		return "", fmt.Errorf("outbox: schema: %w", err)
	}
	return schema, nil
}

// validSchema accepts a schema name PostgreSQL takes as it is: 1 to 63 bytes, no NUL.
func validSchema(s string) error {
	switch {
	case s == "":
		return errors.New("empty")
	case len(s) > 63:
		return fmt.Errorf("%q is longer than PostgreSQL's 63 bytes", s)
	case strings.ContainsRune(s, 0):
		return fmt.Errorf("%q holds a NUL byte", s)
	}
	return nil
}

// Outbox writes messages into the outbox table inside the caller's transaction: they are
// published (by a Relay) if and only if that transaction commits.
type Outbox struct {
	cfg    Config
	table  string // the outbox table, quoted: "schema".outbox
	notify string // the channel a relay listens on
}

// New returns an Outbox that writes to the table of config.Schema. It does not touch the
// database: Migrate creates the table. It logs nothing (Publish returns its errors): logger
// is there for the shape of warren's constructors.
func New(config Config, _ watermill.LoggerAdapter) (*Outbox, error) {
	config = config.WithDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	return &Outbox{cfg: config, table: table(config.Schema), notify: channel(config.Schema)}, nil
}

// table is the outbox table of schema, quoted for SQL.
func table(schema string) string { return pgx.Identifier{schema, "outbox"}.Sanitize() }

// inboxTable is the inbox table of schema, quoted for SQL.
func inboxTable(schema string) string { return pgx.Identifier{schema, "inbox"}.Sanitize() }

// channel is the LISTEN/NOTIFY channel of schema's outbox.
func channel(schema string) string { return "warren.outbox." + schema }

//go:embed schema.sql
var schemaSQL string

// Migrate creates the outbox's schema, table and index if they do not exist. It may run
// any number of times, from several processes at once.
func (o *Outbox) Migrate(ctx context.Context, db Execer) error {
	return Migrate(ctx, db, o.cfg.Schema)
}

// Migrate creates the outbox's schema, table and index in schema (DefaultSchema if "") if
// they do not exist. It may run any number of times, from several processes at once: it
// holds a transaction-level advisory lock while it runs, so db should be a pool or a
// connection, not a transaction that goes on to do other work.
func Migrate(ctx context.Context, db Execer, schema string) error {
	schema, err := schemaOr(schema)
	if err != nil {
		return err
	}
	sql := strings.ReplaceAll(schemaSQL, "{{schema}}", pgx.Identifier{schema}.Sanitize())
	// CREATE ... IF NOT EXISTS races with itself (a unique violation in pg_namespace or
	// pg_class): one migration at a time, in one implicit transaction.
	sql = "SELECT pg_advisory_xact_lock(" + strconv.FormatInt(lockKey(schema)+1, 10) + ");\n" + sql
	if _, err := db.Exec(ctx, sql, pgx.QueryExecModeSimpleProtocol); err != nil {
		return fmt.Errorf("outbox: migrate schema %q: %w", schema, err)
	}
	return nil
}

// lockKey is the advisory lock key of schema's outbox: the relay that holds it is the one
// that publishes (Migrate uses the key after it).
func lockKey(schema string) int64 {
	h := fnv.New64a() // stable across processes and versions
	h.Write([]byte("warren.outbox." + schema))
	return int64(h.Sum64() &^ (1 << 63)) // positive, with room for +1
}

// Publish writes msgs, to be published to topic, into the outbox through tx: the caller's
// transaction, so that they are published if and only if it commits. Everything
// dlx.Publisher honours works through it: a delay (counted from this call), DeliverAt,
// schedule ids, routing by topic, AMQP properties in metadata. The relay publishes the
// messages of one transaction in the order they were written, each with the same publish id
// on every copy (warren.MetadataPublishID if set, else a new one), so that a consumer drops
// the copy a relay killed between the broker's confirm and its delete sends again.
//
// A delay that dlx would refuse (negative, garbage, a DeliverAt further in the past than
// Config.PastTolerance) is an error here, and nothing is written.
func (o *Outbox) Publish(ctx context.Context, tx Execer, topic string, msgs ...*message.Message) error {
	if len(msgs) == 0 {
		return nil
	}
	now := time.Now()
	uuids := make([][]byte, len(msgs))
	payloads := make([][]byte, len(msgs))
	metas := make([][]byte, len(msgs))
	ids := make([]string, len(msgs))
	dues := make([]*time.Time, len(msgs))
	for i, msg := range msgs {
		at, err := due.At(msg, now, o.cfg.PastTolerance)
		if err != nil {
			return fmt.Errorf("outbox: message %s to %q: %w: %w", msg.UUID, topic, warren.ErrInvalidDelay, err)
		}
		if !at.IsZero() {
			dues[i] = &at
		}
		md := make(message.Metadata, len(msg.Metadata)+2)
		for k, v := range msg.Metadata {
			if !warren.IsDelayMetadata(k) && k != warren.MetadataPublishID {
				md[k] = v
			}
		}
		tctx := ctx // the trace of the call, or of the message where it has one (a handler's output)
		if trace.SpanContextFromContext(msg.Context()).IsValid() {
			tctx = msg.Context()
		}
		o.cfg.Propagator.Inject(tctx, propagation.MapCarrier(md))
		ids[i] = msg.Metadata.Get(warren.MetadataPublishID)
		if ids[i] == "" {
			ids[i] = strconv.FormatUint(rand.Uint64(), 16)
		}
		uuids[i], payloads[i], metas[i] = []byte(msg.UUID), msg.Payload, encodeMetadata(md)
		if payloads[i] == nil {
			payloads[i] = []byte{}
		}
	}
	// One statement for every message, and a notification that PostgreSQL sends when (and
	// only if) the transaction commits; a relay that misses it finds the rows by polling.
	_, err := tx.Exec(ctx, "WITH written AS (INSERT INTO "+o.table+" (topic, uuid, payload, metadata, publish_id, due) "+
		"SELECT $1::bytea, uuid, payload, metadata, publish_id, due "+
		"FROM unnest($2::bytea[], $3::bytea[], $4::bytea[], $5::text[], $6::timestamptz[]) "+
		"WITH ORDINALITY AS m(uuid, payload, metadata, publish_id, due, n) ORDER BY n) "+
		"SELECT pg_notify($7, '')",
		[]byte(topic), uuids, payloads, metas, ids, dues, o.notify)
	if err != nil {
		return fmt.Errorf("outbox: write %d message(s) to %q: %w", len(msgs), topic, err)
	}
	return nil
}

// encodeMetadata writes md as bytes, any bytes in keys and values: the number of pairs, then
// each key and value with its length (unsigned varints), keys in order.
func encodeMetadata(md message.Metadata) []byte {
	keys := make([]string, 0, len(md))
	n := binary.MaxVarintLen64
	for k, v := range md {
		keys = append(keys, k)
		n += 2*binary.MaxVarintLen64 + len(k) + len(v)
	}
	slices.Sort(keys)
	b := make([]byte, 0, n)
	b = binary.AppendUvarint(b, uint64(len(keys)))
	for _, k := range keys {
		b = binary.AppendUvarint(b, uint64(len(k)))
		b = append(b, k...)
		b = binary.AppendUvarint(b, uint64(len(md[k])))
		b = append(b, md[k]...)
	}
	return b
}

// decodeMetadata reads what encodeMetadata wrote.
func decodeMetadata(b []byte) (message.Metadata, error) {
	next := func() ([]byte, error) {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > uint64(len(b)-k) {
			return nil, errors.New("outbox: metadata is cut short")
		}
		s := b[k : k+int(n)]
		b = b[k+int(n):]
		return s, nil
	}
	count, k := binary.Uvarint(b)
	if k <= 0 || count > uint64(len(b)) {
		return nil, errors.New("outbox: metadata is cut short")
	}
	b = b[k:]
	md := make(message.Metadata, count)
	for range count {
		key, err := next()
		if err != nil {
			return nil, err
		}
		value, err := next()
		if err != nil {
			return nil, err
		}
		md[string(key)] = string(value)
	}
	if len(b) != 0 {
		return nil, errors.New("outbox: metadata has bytes after its end")
	}
	return md, nil
}
