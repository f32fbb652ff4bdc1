package outbox

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// Querier runs a query that returns one row: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Stats is the state of an outbox and its inbox (ReadStats).
type Stats struct {
	// Schema is the outbox's schema.
	Schema string
	// Waiting is how many rows wait for a relay (set-aside rows not counted).
	Waiting int64
	// Oldest is the age of the oldest waiting row: how far the relay lags (0 when none waits).
	Oldest time.Duration
	// SetAside is how many rows the broker would not take, waiting for a replay
	// (ListSetAside, Replay).
	SetAside int64
	// Relays is how many relays are connected to the database (one publishes, the others
	// stand by); Leading tells whether one holds the outbox's lock.
	Relays  int
	Leading bool
	// InboxKeys is PostgreSQL's estimate of the inbox's keys (pg_class.reltuples, as of the
	// last VACUUM or ANALYZE; -1 before the first): counting them would read the table.
	InboxKeys int64
}

// relayApplicationName is the application_name of a relay's connection, by which ReadStats
// counts the relays: ASCII and short whatever the schema's name (PostgreSQL keeps 63 bytes of
// printable ASCII), so it names the schema by its lock key.
func relayApplicationName(schema string) string {
	return "warren outbox relay " + strconv.FormatInt(lockKey(schema), 16)
}

// ReadStats reads the state of the outbox of schema (DefaultSchema if "") and its inbox.
func ReadStats(ctx context.Context, db Querier, schema string) (Stats, error) {
	schema, err := schemaOr(schema)
	if err != nil {
		return Stats{}, err
	}
	s := Stats{Schema: schema}
	var oldest *time.Time
	var now time.Time
	inbox := inboxTable(schema)
	err = db.QueryRow(ctx, "SELECT now(), "+
		"(SELECT count(*) FROM "+table(schema)+" WHERE set_aside IS NULL), "+
		"(SELECT min(written) FROM "+table(schema)+" WHERE set_aside IS NULL), "+
		"(SELECT count(*) FROM "+table(schema)+" WHERE set_aside IS NOT NULL), "+
		"(SELECT count(*) FROM pg_stat_activity WHERE application_name = $1), "+
		"EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "+
		"AND ((classid::bigint << 32) | objid::bigint) = $2), "+
		"(SELECT reltuples::bigint FROM pg_class WHERE oid = $3::regclass)",
		relayApplicationName(schema), lockKey(schema), inbox).
		Scan(&now, &s.Waiting, &oldest, &s.SetAside, &s.Relays, &s.Leading, &s.InboxKeys)
	if err != nil {
		return Stats{}, fmt.Errorf("outbox: read the state of schema %q: %w", schema, err)
	}
	if oldest != nil {
		s.Oldest = max(now.Sub(*oldest), 0)
	}
	return s, nil
}

// Problems lists what is wrong with the outbox, a line each and without its schema: rows set
// aside, rows waiting while no relay is connected.
func (s Stats) Problems() []string {
	var ps []string
	if s.SetAside > 0 {
		ps = append(ps, rowCount(s.SetAside)+" set aside")
	}
	if s.Waiting > 0 && s.Relays == 0 {
		ps = append(ps, rowCount(s.Waiting)+" waiting and no relay connected")
	}
	return ps
}

func rowCount(n int64) string {
	if n == 1 {
		return "1 row"
	}
	return strconv.FormatInt(n, 10) + " rows"
}

// SetAsideRow is a row the broker would not take.
type SetAsideRow struct {
	ID     int64     `json:"id"`
	Topic  string    `json:"topic"`
	UUID   string    `json:"uuid"`
	At     time.Time `json:"set_aside"`
	Reason string    `json:"reason"`
}

// ListSetAside returns up to limit rows set aside in the outbox of schema, oldest first.
func ListSetAside(ctx context.Context, db interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}, schema string, limit int) ([]SetAsideRow, error) {
	schema, err := schemaOr(schema)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, "SELECT id, topic, uuid, set_aside, reason FROM "+table(schema)+
		" WHERE set_aside IS NOT NULL ORDER BY id LIMIT $1", limit)
	if err != nil {
		return nil, fmt.Errorf("outbox: list set-aside rows: %w", err)
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (SetAsideRow, error) {
		var (
			s           SetAsideRow
			topic, uuid []byte
			reason      *string
		)
		err := r.Scan(&s.ID, &topic, &uuid, &s.At, &reason)
		s.Topic, s.UUID = string(topic), string(uuid)
		if reason != nil {
			s.Reason = *reason
		}
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: list set-aside rows: %w", err)
	}
	return list, nil
}

// Replay gives the set-aside rows ids (all of them if none) back to the relay, which tries
// them again in their place in the order: mend what made the broker refuse them first.
// It returns how many rows it gave back.
func Replay(ctx context.Context, db Execer, schema string, ids ...int64) (int64, error) {
	schema, err := schemaOr(schema)
	if err != nil {
		return 0, err
	}
	var only []int64 // nil: NULL, every row
	if len(ids) > 0 {
		only = ids
	}
	tag, err := db.Exec(ctx, "UPDATE "+table(schema)+" SET set_aside = NULL, reason = NULL "+
		"WHERE set_aside IS NOT NULL AND ($1::bigint[] IS NULL OR id = ANY($1))", only)
	if err != nil {
		return 0, fmt.Errorf("outbox: replay: %w", err)
	}
	if tag.RowsAffected() > 0 {
		// Wakes a relay now (it would find the rows at its next poll anyway).
		_, _ = db.Exec(ctx, "SELECT pg_notify($1, '')", channel(schema))
	}
	return tag.RowsAffected(), nil
}
