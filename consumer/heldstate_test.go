package consumer

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/held"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// Writes and reads of a held state that many lanes of a process make at once go to the broker
// in batches: every write lands, none undoes another, and each caller gets a state that
// has its own write in it (its batch began after the call).
func TestHeldStateWritesInBatchesLoseNone(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("batched")
	env.Remove([]string{topology.HeldState(queue), held.LockQueue(queue)}, nil)
	s, err := NewSubscriber(Config{Connection: env.Connection(), Topology: topology.Config{Delay: env.Delay(topology.Delay{})}}, env.Logger())
	require.NoError(t, err)
	defer s.Close()

	const writers = 40
	var wg sync.WaitGroup
	for i := range writers {
		key := fmt.Sprintf("k%02d", i)
		wg.Go(func() {
			st, err := s.updateHolds(queue, func(st *held.State) bool {
				st.Keys[key] = held.Entry{Key: key, Lane: topology.LaneQueue(queue, 0)}
				return true
			})
			if assert.NoError(t, err, key) {
				assert.Contains(t, st.Keys, key, "the state returned to its writer")
			}
		})
		wg.Go(func() { // a reader between the writers
			_, err := s.updateHolds(queue, nil)
			assert.NoError(t, err)
		})
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience())
	defer cancel()
	conn, _, err := amqpx.Dial(ctx, env.Connection(), "held state reader")
	require.NoError(t, err)
	defer conn.Close()
	st, err := held.Read(ctx, conn, queue) // on a connection of its own: what another process reads
	require.NoError(t, err)
	assert.Len(t, st.Keys, writers, "every write is in the state")
}
