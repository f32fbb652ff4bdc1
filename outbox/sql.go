package outbox

import (
	"context"
	"database/sql"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
)

// SQLExecer is what SQL adapts: a *sql.Tx (the usual case), a *sql.DB or a *sql.Conn.
type SQLExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// SQL adapts a database/sql transaction for Publish and Migrate, for services that use
// database/sql. Its driver must be pgx's (github.com/jackc/pgx/v5/stdlib: sql.Open("pgx",
// url) or stdlib.OpenDB), which hands Publish's arrays of bytes to pgx as they are; another
// driver fails the write. The relay and the inbox take a pgxpool.Pool.
func SQL(db SQLExecer) Execer { return sqlExecer{db} }

type sqlExecer struct{ db SQLExecer }

func (s sqlExecer) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	res, err := s.db.ExecContext(ctx, query, args...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	return pgconn.NewCommandTag("EXEC " + strconv.FormatInt(n, 10)), nil
}
