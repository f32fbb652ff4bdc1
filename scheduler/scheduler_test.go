package scheduler_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/scheduler"
	"github.com/warrenmq/warren/topology"
)

func TestConfigValidationNamesTheField(t *testing.T) {
	conn := warren.Connection{URL: "amqp://guest:guest@127.0.0.1:5672/"}
	job := scheduler.Job{Name: "j", Schedule: "@every 1s", Topic: "q"}
	for field, cfg := range map[string]scheduler.Config{
		"Config.Connection.URL":             {Jobs: []scheduler.Job{job}},
		"Config.Jobs is empty":              {Connection: conn},
		"Config.Jobs[1].Name \"j\" is used": {Connection: conn, Jobs: []scheduler.Job{job, job}},
		"Config.Jobs[0].Name is empty":      {Connection: conn, Jobs: []scheduler.Job{{Schedule: "@daily", Topic: "q"}}},
		"Config.Jobs[0].Topic is empty":     {Connection: conn, Jobs: []scheduler.Job{{Name: "j", Schedule: "@daily"}}},
		`Config.Jobs[0].Schedule "* * *"`:   {Connection: conn, Jobs: []scheduler.Job{{Name: "j", Schedule: "* * *", Topic: "q"}}},
		`Config.Missed "later"`:             {Connection: conn, Jobs: []scheduler.Job{job}, Missed: "later"},
		"Config.MaxCatchUp -1":              {Connection: conn, Jobs: []scheduler.Job{job}, MaxCatchUp: -1},
		"Config.Prefix \"amq.s\"":           {Connection: conn, Jobs: []scheduler.Job{job}, Prefix: "amq.s"},
		"Config.Topology: topology: Delay.Radix": {Connection: conn, Jobs: []scheduler.Job{job},
			Topology: topology.Config{Delay: topology.Delay{Radix: 1000}}},
	} {
		_, err := scheduler.New(cfg, nil)
		assert.ErrorContains(t, err, field)
	}
}

// tick is a tick as it arrived.
type tick struct {
	id      string
	at, due time.Time
}

// byDue sorts tk by due time: ticks a second apart may arrive out of order on a loaded
// machine, each taking its own path through the delay levels.
func byDue(tk []tick) []tick {
	slices.SortFunc(tk, func(a, b tick) int { return a.due.Compare(b.due) })
	return tk
}

// collect consumes queue and records every tick, until the test ends.
func collect(t *testing.T, env *testenv.Env, queue string) func() []tick {
	ch := env.Channel()
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	require.NoError(t, err)
	var (
		mu  sync.Mutex
		got []tick
	)
	go func() {
		for d := range deliveries {
			due, _ := time.Parse(time.RFC3339Nano, d.Headers[scheduler.MetadataTick].(string))
			mu.Lock()
			got = append(got, tick{id: d.MessageId, at: time.Now(), due: due})
			mu.Unlock()
		}
	}()
	return func() []tick {
		mu.Lock()
		defer mu.Unlock()
		return append([]tick(nil), got...)
	}
}

// runScheduler runs a Scheduler of cfg until the test ends.
func runScheduler(t *testing.T, env *testenv.Env, cfg scheduler.Config) *scheduler.Scheduler {
	s, err := scheduler.New(cfg, env.Logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	go func() { assert.NoError(t, s.Run(context.Background())) }()
	return s
}

// Three schedulers of one group; the active one stops. Another takes over at once, and the
// ticks go on: none lost, none twice, none early.
func TestOneActiveAndHandover(t *testing.T) {
	t.Parallel()
	env := testenv.Logic(t)
	q := env.WorkQueue("ticks")
	name := env.Name("group")
	env.Remove([]string{scheduler.LockQueue(scheduler.DefaultPrefix, name), scheduler.StateQueue(scheduler.DefaultPrefix, name)}, nil)
	ticks := collect(t, env, q)
	delay := env.Delay(topology.Delay{})

	var scheds []*scheduler.Scheduler
	for range 3 {
		scheds = append(scheds, runScheduler(t, env, scheduler.Config{Connection: env.Connection(), Topology: topology.Config{Delay: delay},
			Name: name, Jobs: []scheduler.Job{{Name: "every-second", Schedule: "@every 1s", Topic: q, Payload: []byte("tick")}}}))
	}
	active := func() (n int, which *scheduler.Scheduler) {
		for _, s := range scheds {
			if s.Active() {
				n, which = n+1, s
			}
		}
		return n, which
	}
	require.Eventually(t, func() bool { n, _ := active(); return n == 1 }, testenv.Patience(), 10*time.Millisecond)
	require.Eventually(t, func() bool { return len(ticks()) >= 3 }, testenv.Patience(), 10*time.Millisecond)
	_, first := active()
	require.NoError(t, first.Close())
	stopped := time.Now()
	require.Eventually(t, func() bool { n, s := active(); return n == 1 && s != first }, testenv.Patience(), time.Millisecond)
	t.Logf("handover in %s", time.Since(stopped).Round(time.Millisecond))
	got := len(ticks())
	require.Eventually(t, func() bool { return len(ticks()) >= got+3 }, testenv.Patience(), 10*time.Millisecond)
	for _, s := range scheds {
		require.NoError(t, s.Close())
	}
	conn, err := env.Dial()
	require.NoError(t, err)
	defer conn.Close()
	// The lock queue is a quorum queue: it counts a closed consumer out once the broker has
	// seen its channel go, a moment after Close.
	var g scheduler.Group
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		var found bool
		g, found, err = scheduler.ReadGroup(context.Background(), conn, scheduler.DefaultPrefix, name)
		require.NoError(c, err)
		require.True(c, found)
		assert.Zero(c, g.Schedulers, "all closed")
	}, testenv.Patience(), 10*time.Millisecond)
	assert.Equal(t, "@every 1s", g.Jobs["every-second"].Schedule)
	// Every tick up to the last one published ahead, and recorded, is delivered after the
	// close, none missing.
	last := g.Jobs["every-second"].Next
	require.Eventually(t, func() bool {
		tk := byDue(ticks())
		dues := map[time.Time]bool{}
		for _, k := range tk {
			dues[k.due] = true
		}
		return len(tk) > 0 && tk[len(tk)-1].due.Equal(last) && last.Sub(tk[0].due) == time.Duration(len(dues)-1)*time.Second
	}, testenv.Patience(), 10*time.Millisecond, "every tick up to the last one recorded, %s, arrives", last)

	all := byDue(ticks())
	seen := map[string]bool{}
	for i, tk := range all {
		assert.False(t, seen[tk.id], "tick %s twice", tk.id)
		seen[tk.id] = true
		assert.False(t, tk.at.Before(tk.due), "tick %s %s early", tk.id, tk.due.Sub(tk.at))
		if i > 0 {
			assert.Equal(t, time.Second, tk.due.Sub(all[i-1].due), "ticks %s and %s: one lost between them?", all[i-1].id, tk.id)
		}
		t.Logf("%s %s late", tk.id, tk.at.Sub(tk.due).Round(time.Millisecond))
	}
	assert.Equal(t, all[len(all)-1].due, last, "the last tick published is the last one recorded")
}

// Ticks that came due while no scheduler of the group ran are published at once on takeover
// (CatchUp), or counted and skipped (Skip).
func TestMissedTicksCaughtUpOrSkipped(t *testing.T) {
	t.Parallel()
	for _, policy := range []scheduler.Missed{scheduler.CatchUp, scheduler.Skip} {
		t.Run(string(policy), func(t *testing.T) {
			t.Parallel()
			env := testenv.New(t)
			q := env.WorkQueue("ticks")
			name := env.Name("group")
			env.Remove([]string{scheduler.LockQueue(scheduler.DefaultPrefix, name), scheduler.StateQueue(scheduler.DefaultPrefix, name)}, nil)
			ticks := collect(t, env, q)
			cfg := scheduler.Config{Connection: env.Connection(), Topology: topology.Config{Delay: env.Delay(topology.Delay{})}, Name: name,
				Missed: policy, Jobs: []scheduler.Job{{Name: "j", Schedule: "@every 1s", Topic: q}}}
			start := func() *scheduler.Scheduler { return runScheduler(t, env, cfg) }
			first := start()
			require.Eventually(t, func() bool { return len(ticks()) >= 1 }, testenv.Patience(), 10*time.Millisecond)
			require.NoError(t, first.Close())   // its next tick waits in the levels, and is delivered
			time.Sleep(3500 * time.Millisecond) // no scheduler for 3 ticks: real time must pass
			start()
			n := len(ticks())
			require.Eventually(t, func() bool { return len(ticks()) >= n+2 }, testenv.Patience(), 10*time.Millisecond)

			all := byDue(ticks())
			var gaps []time.Duration
			for i := 1; i < len(all); i++ {
				if gap := all[i].due.Sub(all[i-1].due); gap != time.Second {
					gaps = append(gaps, gap)
				}
			}
			for _, tk := range all {
				t.Logf("%s arrived %s after it was due", tk.id, tk.at.Sub(tk.due).Round(time.Millisecond))
			}
			conn, err := env.Dial()
			require.NoError(t, err)
			defer conn.Close()
			g, _, err := scheduler.ReadGroup(context.Background(), conn, scheduler.DefaultPrefix, name)
			require.NoError(t, err)
			if policy == scheduler.CatchUp {
				assert.Empty(t, gaps, "every tick, the missed ones published on takeover")
				assert.Zero(t, g.Jobs["j"].Missed)
			} else {
				// The gap of the takeover; and on a loaded machine maybe others, where the
				// active scheduler came to a tick after its time had passed.
				require.NotEmpty(t, gaps, "a gap, where the ticks were skipped")
				skipped := 0
				for _, gap := range gaps {
					skipped += int(gap/time.Second) - 1
				}
				assert.GreaterOrEqual(t, slices.Max(gaps), 3*time.Second, "the ticks missed while no scheduler ran skipped: %v", gaps)
				assert.Equal(t, skipped, g.Jobs["j"].Missed)
			}
		})
	}
}

// A state whose next tick is far ahead of the clock (forged here; a clock set back would do
// the same) does not stop the job: it goes on from the clock's next tick. On a node of its own
// (a forged message).
func TestAStateAheadOfTheClockIsDropped(t *testing.T) {
	t.Parallel()
	node := testenv.StartNode(t)
	env := testenv.NewAt(t, node.URL())
	q := env.WorkQueue("ticks")
	name := env.Name("group")
	ticks := collect(t, env, q)
	cfg := scheduler.Config{Connection: env.Connection(), Topology: topology.Config{Delay: env.Delay(topology.Delay{})}, Name: name,
		Jobs: []scheduler.Job{{Name: "j", Schedule: "@every 1s", Topic: q}}}
	start := func() *scheduler.Scheduler { return runScheduler(t, env, cfg) }
	first := start()
	require.Eventually(t, func() bool { return len(ticks()) >= 1 }, testenv.Patience(), 10*time.Millisecond)
	require.NoError(t, first.Close())

	forged := fmt.Sprintf(`{"jobs":{"j":{"schedule":"@every 1s","topic":%q,"next":"9999-01-01T00:00:00Z"}},"by":"forger","at":"9999-01-01T00:00:00Z"}`, q)
	ch := env.Channel()
	require.NoError(t, ch.Confirm(false))
	dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", scheduler.StateQueue(scheduler.DefaultPrefix, name), false, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte(forged)})
	require.NoError(t, err)
	ok, err := dc.WaitContext(context.Background())
	require.NoError(t, err)
	require.True(t, ok)

	n := len(ticks())
	start()
	require.Eventually(t, func() bool { return len(ticks()) >= n+3 }, testenv.Patience(), 10*time.Millisecond,
		"ticks go on after a takeover that read the forged state")
}

// The scheduler's connection (the lock's) is reported as every component's is:
// Connection.OnEvent hears it connected, lost (reconnecting) and connected again, and the
// scheduler is active again on the new one.
func TestSchedulerConnectionIsReported(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("ticks")
	name := env.Name("group")
	env.Remove([]string{scheduler.LockQueue(scheduler.DefaultPrefix, name), scheduler.StateQueue(scheduler.DefaultPrefix, name)}, nil)
	proxy, url := testenv.ProxyURL(t, env.URL)
	events := make(chan warren.ConnectionEvent, 64)
	conn := warren.Connection{URL: url, OnEvent: func(e warren.ConnectionEvent) {
		if e.Name != "warren scheduler "+name { // its publisher's are reported too
			return
		}
		select {
		case events <- e:
		default: // the test has what it needs
		}
	}}
	s := runScheduler(t, env, scheduler.Config{Connection: conn, Topology: topology.Config{Delay: env.Delay(topology.Delay{})},
		Name: name, Jobs: []scheduler.Job{{Name: "hourly", Schedule: "@hourly", Topic: q}}})
	expect := func(state warren.ConnectionState) {
		t.Helper()
		select {
		case e := <-events:
			assert.Equal(t, state, e.State, "%+v", e)
			assert.Equal(t, proxy.Addr(), e.Node)
		case <-time.After(testenv.Patience()):
			t.Fatalf("no %s event", state)
		}
	}
	expect(warren.Connected)
	require.Eventually(t, s.Active, testenv.Patience(), 10*time.Millisecond)
	proxy.Drop()
	expect(warren.Reconnecting)
	expect(warren.Connected)
	require.Eventually(t, s.Active, testenv.Patience(), 10*time.Millisecond, "active again on the new connection")
}
