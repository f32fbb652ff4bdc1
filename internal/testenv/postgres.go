package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresURL is the PostgreSQL the tests use: $WARREN_POSTGRES_URL as the run was given it
// (read when the tests start, so that a TestMain may unset it for the commands it tests), or
// the local one as `make postgres` and docker-compose.yml set it up.
func PostgresURL() string {
	if givenPostgresURL != "" {
		return givenPostgresURL
	}
	return "postgres://postgres:postgres@127.0.0.1:5432/postgres?sslmode=disable"
}

// givenPostgresURL is $WARREN_POSTGRES_URL when the tests started.
var givenPostgresURL = os.Getenv("WARREN_POSTGRES_URL")

// Postgres connects to PostgresURL (failing t if it cannot: start it with `make postgres`)
// and returns a pool, closed when t ends, and a schema name of t's own ("wt_" and random
// hex), dropped with everything in it when t ends.
func Postgres(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	return PostgresAt(t, PostgresURL())
}

// PostgresAt is Postgres on the server at url (a PGServer's, say).
func PostgresAt(t testing.TB, url string) (*pgxpool.Pool, string) {
	t.Helper()
	NeedsBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), Patience())
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		t.Fatalf("no PostgreSQL at %s (start it with `make postgres`): %v", redactPostgres(url), err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "wt_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), Patience())
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
		pool.Close()
	})
	return pool, schema
}

// redactPostgres drops the password from a PostgreSQL URL.
func redactPostgres(u string) string {
	cfg, err := pgx.ParseConfig(u)
	if err != nil {
		return "(an unreadable URL)"
	}
	return cfg.User + "@" + cfg.Host + ":" + strconv.Itoa(int(cfg.Port)) + "/" + cfg.Database
}
