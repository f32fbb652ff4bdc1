package amqpx_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/amqpurl"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
)

// refusedURL returns the URL of a port nobody listens on.
func refusedURL(t *testing.T) string {
	return "amqp://guest:s3cr3t@" + testenv.ClosedPort(t) + "/"
}

// A list is tried in a random order until a node answers: a node down is passed over
// whatever its place.
func TestDialTriesEveryNodeOfAList(t *testing.T) {
	t.Parallel()
	testenv.NeedsBroker(t)
	list := refusedURL(t) + "," + testenv.URL() + "," + refusedURL(t)
	for range 6 {
		conn, _, err := amqpx.Dial(context.Background(), warren.Connection{URL: list}, "test")
		require.NoError(t, err)
		require.NoError(t, conn.Close())
	}
}

// When no node answers, the error names every node (without its password) and why.
//
// Not parallel: it bounds the time the dial takes.
func TestDialOfAListWithoutALiveNodeNamesEveryNode(t *testing.T) {
	a, b := refusedURL(t), "amqp://guest:s3cr3t@"+blackHole(t)+"/"
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	_, _, err := amqpx.Dial(ctx, warren.Connection{URL: a + "," + b}, "test")
	// Each node gets a share of the time left: the black hole, tried first, half of it.
	assert.LessOrEqual(t, time.Since(start), 1100*time.Millisecond+150*time.Millisecond)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no node of 2 answered")
	for _, u := range []string{a, b} {
		assert.Contains(t, err.Error(), amqpurl.Redact(u))
	}
	assert.NotContains(t, err.Error(), "s3cr3t")
	assert.True(t, strings.Contains(err.Error(), "refused"), err.Error())
}
