package main

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/outbox"
)

// warren outbox migrate creates the outbox (again: nothing happens); status shows the rows
// waiting and that no relay runs; set-aside and replay find no row set aside; a replay of a
// row that is not set aside is done in part (exit 3).
func TestOutboxCommands(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	pool, schema := testenv.Postgres(t)
	pg := testenv.PostgresURL()
	for range 2 {
		assert.Equal(t, "outbox in schema "+schema+": ready\n", run(t, env.URL, "outbox", "migrate", "--postgres", pg, "--schema", schema))
	}
	box, err := outbox.New(outbox.Config{Schema: schema}, nil)
	require.NoError(t, err)
	require.NoError(t, box.Publish(context.Background(), pool, "orders", message.NewMessage("a", nil), message.NewMessage("b", nil)))

	out := run(t, env.URL, "outbox", "status", "--postgres", pg, "--schema", schema)
	assert.Contains(t, out, "outbox "+schema+": 2 rows waiting, the oldest written ")
	assert.Contains(t, out, "0 rows set aside")
	assert.Contains(t, out, "relays: none connected: nothing is published")

	var st struct {
		Waiting  int64 `json:"waiting"`
		OldestMS int64 `json:"oldest_ms"`
		Relays   int   `json:"relays"`
	}
	require.NoError(t, json.Unmarshal([]byte(run(t, env.URL, "outbox", "status", "--json", "--postgres", pg, "--schema", schema)), &st))
	assert.Equal(t, int64(2), st.Waiting)
	assert.Zero(t, st.Relays)

	assert.Equal(t, "no rows set aside\n", run(t, env.URL, "outbox", "set-aside", "--postgres", pg, "--schema", schema))
	stdout, stderr, code := runCode(t, env.URL, "outbox", "replay", "1", "--postgres", pg, "--schema", schema)
	assert.Equal(t, "0 rows given back to the relay\n", stdout)
	assert.Contains(t, stderr, "1 of the 1 rows named were not set aside")
	assert.Equal(t, exitUnconfirmed, code)

}

// Without --postgres or $WARREN_POSTGRES_URL the command says how to name the database.
// (Not parallel: it sets the environment.)
func TestOutboxNeedsADatabase(t *testing.T) {
	t.Setenv("WARREN_POSTGRES_URL", "")
	_, stderr, code := runCode(t, testenv.URL(), "outbox", "status")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, "name the database: --postgres URL or $WARREN_POSTGRES_URL")
}
