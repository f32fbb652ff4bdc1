package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/kill"
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

	require.Eventually(t, s.Active, testenv.Patience(), 10*time.Millisecond)
	var g scheduler.Group
	require.Eventually(t, func() bool {
		out := run(t, env.URL, "schedules", "list", name, "--json")
		return json.Unmarshal([]byte(out), &g) == nil && len(g.Jobs) == 1
	}, testenv.Patience(), 50*time.Millisecond)
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

// schedules list without a group lists the groups the management API finds under --prefix,
// with their schedulers: a name may hold dots, and a work queue's kill lock under the prefix
// (PREFIX.Q.kill.lock, beside PREFIX.Q.kill.state) is no group.
func TestSchedulesListWithoutAGroupListsTheGroups(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("ticks")
	prefix := env.Name("sched")
	for _, name := range []string{"b.c", "a"} {
		env.Remove([]string{scheduler.LockQueue(prefix, name), scheduler.StateQueue(prefix, name)}, nil)
		s, err := scheduler.New(scheduler.Config{Connection: env.Connection(), Topology: topology.Config{Delay: env.Delay(topology.Delay{})},
			Prefix: prefix, Name: name, Jobs: []scheduler.Job{{Name: "hourly", Schedule: "@every 1h", Topic: q}}}, env.Logger())
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		go func() { assert.NoError(t, s.Run(context.Background())) }()
		require.Eventually(t, s.Active, testenv.Patience(), 10*time.Millisecond)
	}
	lookalike := prefix + ".work"
	env.Remove([]string{kill.LockQueue(lookalike), kill.StateQueue(lookalike, nil)}, nil)
	ch := env.Channel()
	_, err := ch.QueueDeclare(kill.LockQueue(lookalike), false, true, false, false, nil)
	require.NoError(t, err)
	_, err = ch.QueueDeclare(kill.StateQueue(lookalike, nil), true, false, false, false, nil)
	require.NoError(t, err)

	mg := managementURL
	var groups []schedulerGroup
	require.Eventually(t, func() bool { // once each active scheduler has recorded its job
		out := run(t, env.URL, "schedules", "list", "--prefix", prefix, "--management", mg, "--json")
		return json.Unmarshal([]byte(out), &groups) == nil && len(groups) == 2 && groups[0].Jobs == 1 && groups[1].Jobs == 1
	}, testenv.Patience(), 50*time.Millisecond, "%+v", groups)
	assert.Equal(t, []schedulerGroup{{Name: "a", Schedulers: 1, Jobs: 1}, {Name: "b.c", Schedulers: 1, Jobs: 1}}, groups)
	out := run(t, env.URL, "schedules", "list", "--prefix", prefix, "--management", mg)
	assert.Regexp(t, `^GROUP +SCHEDULERS +JOBS\na +1 +1\nb\.c +1 +1\nwarren schedules list GROUP lists a group's jobs\n$`, out)

	assert.Equal(t, "no scheduler group: no queue "+prefix+".none.GROUP.lock\n",
		run(t, env.URL, "schedules", "list", "--prefix", prefix+".none", "--management", mg))
}

// Without a group and without the management API, schedules list reads no group: it says
// how to name one, and that only the management API lists them.
func TestSchedulesListWithoutAGroupOrManagementSaysSo(t *testing.T) {
	t.Setenv("WARREN_MANAGEMENT_URL", "")
	_, stderr, code := runCode(t, testenv.URL(), "schedules", "list")
	assert.Equal(t, 1, code)
	assert.Contains(t, stderr, `name the group (warren schedules list GROUP; a scheduler without scheduler.Config.Name is in group "default"): `+
		"only the management API lists the groups (--management or $WARREN_MANAGEMENT_URL)")
}
