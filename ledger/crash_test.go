//go:build faults

package ledger_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/ledger"
)

// The broker is killed (kill -9) and restarted while cancelled and other messages wait: the
// ledger reconnects and reads its stream again, the cancellation holds, and the others are
// handled. On a node of its own.
func TestCancellationSurvivesABrokerCrash(t *testing.T) {
	t.Parallel()
	node := testenv.StartNode(t)
	f := newFixtureAt(t, testenv.NewAt(t, node.URL()))
	q := f.env.Queue("reminders")
	_, err := f.l.List(context.Background(), ledger.Filter{}) // the ledger is declared now
	require.NoError(t, err)
	// A stream that its node loses to a kill -9 within seconds of its declaration stays down
	// for good (RabbitMQ 3.10.8 and 4.0.5; docs/decisions.md); 30 s after, it comes back.
	time.Sleep(30 * time.Second)
	for i := range 4 {
		f.schedule(t, q, fmt.Sprintf("r%d", i), 5*time.Second)
	}
	require.NoError(t, f.l.Cancel(context.Background(), "r2"))
	node.Crash()
	crashed := time.Now()

	entries, err := f.l.List(context.Background(), ledger.Filter{}) // after the ledger reconnected
	require.NoError(t, err)
	t.Logf("listed %s after the crash", time.Since(crashed))
	assert.Len(t, entries, 3, "the three not cancelled wait")
	handled := f.consume(t, q)
	require.Eventually(t, func() bool { return len(handled()) == 3 }, testenv.Patience(), 10*time.Millisecond)
	assert.Never(t, func() bool { return len(handled()) > 3 }, time.Second, 10*time.Millisecond, "the cancelled one handled")
	assert.ElementsMatch(t, []string{"r0", "r1", "r3"}, handled())
	assert.ErrorIs(t, f.l.Cancel(context.Background(), "r0"), ledger.ErrDelivered)
}
