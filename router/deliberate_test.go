package router_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// A kill, then a kill with delete, are deliberate stops: the router whose only handler they
// end logs no error (the end of its handlers at Info), and Run returns nil.
func TestKillDeleteLogsNoError(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	queue := env.Queue("deliberate")
	logger := watermill.NewCaptureLogger()
	r, err := router.New(router.Config{
		Connection: env.Connection(),
		Topology:   topology.Config{Delay: env.Delay(topology.Delay{})},
	}, logger)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(*message.Message) error { return nil }))
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	<-r.Running()

	require.NoError(t, newKiller(t, env, "").Kill(context.Background(), queue, kill.Stop))
	require.NoError(t, newKiller(t, env, "").Kill(context.Background(), queue, kill.Delete))
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(testenv.Patience()):
		t.Fatal("the router did not stop after its only queue was deleted")
	}
	for _, l := range logger.Captured()[watermill.ErrorLogLevel] {
		t.Errorf("logged an error: %s: %v %v", l.Msg, l.Err, l.Fields)
	}
	assert.True(t, slices.ContainsFunc(logger.Captured()[watermill.InfoLogLevel],
		func(m watermill.CapturedMessage) bool { return m.Msg == "All handlers stopped, closing router" }),
		"the end of the handlers is logged at Info")
}
