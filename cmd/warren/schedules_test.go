package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/scheduler"
	"github.com/warrenmq/warren/topology"
)

// schedules list shows what the active scheduler recorded, and how many take part; a group
// that does not exist is exit code 2.
func TestSchedulesList(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("reports")
	name := env.Name("group")
	env.Remove([]string{scheduler.LockQueue(scheduler.DefaultPrefix, name), scheduler.StateQueue(scheduler.DefaultPrefix, name)}, nil)
	s, err := scheduler.New(scheduler.Config{Connection: env.Connection(), Topology: topology.Config{Delay: env.Delay(topology.Delay{})},
		Name: name, Jobs: []scheduler.Job{{Name: "nightly", Schedule: "CRON_TZ=Europe/Paris 0 3 * * *", Topic: q}}}, env.Logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	go func() { assert.NoError(t, s.Run(context.Background())) }()

	require.Eventually(t, s.Active, 10*time.Second, 10*time.Millisecond)
	var g scheduler.Group
	require.Eventually(t, func() bool {
		out := run(t, env.URL, "schedules", "list", name, "--json")
		return json.Unmarshal([]byte(out), &g) == nil && len(g.Jobs) == 1
	}, 10*time.Second, 50*time.Millisecond)
	next := g.Jobs["nightly"].Next
	paris, err := time.LoadLocation("Europe/Paris")
	require.NoError(t, err)
	assert.Equal(t, 3, next.In(paris).Hour(), "03:00 in Paris")
	assert.True(t, next.After(time.Now()))
	assert.Equal(t, 1, g.Schedulers)

	out := run(t, env.URL, "schedules", "list", name)
	assert.Contains(t, out, "group "+name+": 1 scheduler taking part")
	assert.Contains(t, out, "nightly  CRON_TZ=Europe/Paris 0 3 * * *  "+q+"  "+next.UTC().Format(time.RFC3339)+" (in ")

	_, stderr, code := runCode(t, env.URL, "schedules", "list", env.Name("nosuch"))
	assert.Equal(t, exitNoQueue, code)
	assert.Contains(t, stderr, "no scheduler group")
}
