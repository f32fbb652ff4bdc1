//go:build faults

package testenv

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestPGServer checks the throwaway PostgreSQL server: committed rows survive a fast and an
// immediate stop, and nothing of it remains once the test ends.
func TestPGServer(t *testing.T) {
	var dir string
	t.Run("server", func(t *testing.T) {
		s := StartPostgres(t)
		dir = s.Dir()
		if s.Port() == 5432 || !strings.HasPrefix(s.URL(), "postgres://postgres@127.0.0.1:") {
			t.Fatalf("URL %s", s.URL())
		}
		ctx := context.Background()
		exec := func(sql string) {
			t.Helper()
			conn, err := pgx.Connect(ctx, s.URL())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, sql); err != nil {
				t.Fatal(err)
			}
		}
		rows := func() int {
			t.Helper()
			conn, err := pgx.Connect(ctx, s.URL())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var n int
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		exec("CREATE TABLE t (i int); INSERT INTO t VALUES (1)")
		s.Restart(PGFast)
		exec("INSERT INTO t VALUES (2)")
		s.Restart(PGImmediate)
		if n := rows(); n != 2 {
			t.Fatalf("%d rows after the restarts, want 2", n)
		}
		s.Stop(PGImmediate)
		if _, err := pgx.Connect(ctx, s.URL()); err == nil {
			t.Fatal("connected to a stopped server")
		}
		s.Start()
		if n := rows(); n != 2 {
			t.Fatalf("%d rows after Stop and Start, want 2", n)
		}
		if pid := postmasterPID(filepath.Join(dir, "data")); pid <= 0 || !alive(pid) || !cmdlineHas(pid, filepath.Join(dir, "data")) {
			t.Fatalf("no postmaster of the server's (pid %d)", pid)
		}
	})
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s still there: %v", dir, err)
	}
	for _, pid := range procsWith(filepath.Join(dir, "data")) {
		t.Errorf("process %d of the server still runs", pid)
	}
}
