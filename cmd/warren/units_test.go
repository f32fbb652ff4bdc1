package main

import (
	"bytes"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
)

func TestHuman(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		(1<<32 - 1) * time.Millisecond: "49d17h2m47s", // the largest delay of the default delay levels
		1500 * time.Microsecond:        "1.5ms",
		0:                              "0s",
		250 * time.Microsecond:         "250µs",
		1500:                           "1µs",
		999999999:                      "999.999ms",
		5019 * time.Millisecond:        "5.019s",
		59999999999:                    "59.999s",
		time.Minute:                    "1m",
		65535 * time.Millisecond:       "1m5s", // truncated: a maximum is never shown larger
		2 * time.Hour:                  "2h",
		24*time.Hour + 5*time.Minute:   "1d5m",
		30 * time.Second:               "30s",
		-1500 * time.Millisecond:       "-1.5s",
		math.MinInt64:                  "-106751d23h47m16s",
	} {
		assert.Equal(t, want, human(d), "%d", int64(d))
	}
}

func TestPlural(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "1 message", plural(1, "message"))
	assert.Equal(t, "0 messages", plural(0, "message"))
	assert.Equal(t, "2 processes", plural(2, "process"))
}

// The delay levels are described in human units: the default ones delay up to 74·(2^32-1)
// ms, through a chain of 73 queues after the levels.
func TestDescribeDelay(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "delay levels warren.delay.quorum.1ms.r16 (193 quorum queues: 8 levels, radix 16, unit 1ms, a chain of 73; delays up to 3678d13h26m19s)",
		describeDelay(topology.Config{}.WithDefaults().Delay))
	assert.Equal(t, "delay levels d.classic.1000ms.r2 (1 classic queue: 1 level, radix 2, unit 1s; delays up to 1s)",
		describeDelay(topology.Delay{Prefix: "d", QueueType: topology.Classic, Unit: time.Second, Radix: 2, Levels: 1}.WithDefaults()))
}

// status shows a level's TTL in human units, and 1 message as such.
func TestStatusText(t *testing.T) {
	t.Parallel()
	d := topology.Config{}.WithDefaults().Delay
	var out bytes.Buffer
	require.NoError(t, printStatus(&out, ops.Status{Delay: ops.DelayStatus{Name: d.Name(), Waiting: 1, Parked: 0,
		Levels: []ops.LevelStatus{{Queue: d.LevelQueue(7, 15), TTL: d.TTL(7, 15), Messages: 1, Exists: true}, {Queue: d.LevelQueue(0, 1), Exists: true}}}}, d, false, nil))
	assert.Contains(t, out.String(), "\ndelay levels "+d.Name()+": 1 waiting, 0 parked\n  p7.d15 (46d14h28m51s): 1\n")
}

// JSON durations are milliseconds, in keys ending _ms: a level's TTL in status, the wait of
// kill and resume.
func TestJSONDurationsInMilliseconds(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := report(&out, kill.Result{Queue: "q", Action: kill.Stop, Heard: true, QueueConsumers: 1, Consumers: 1, Processes: 1,
		Waited: 1500 * time.Microsecond, Answers: []kill.Answer{{Queue: "q", State: "stopped", Consuming: true}}}, nil,
		sendFlags{wait: time.Second, asJSON: true})
	require.NoError(t, err)
	var res map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &res), out.String())
	assert.Equal(t, 1.5, res["waited_ms"])
	assert.NotContains(t, res, "waited_ns")
	assert.Equal(t, true, res["confirmed"])
	assert.Equal(t, "q", res["queue"])
	assert.Equal(t, 0.0, res["exit_code"])
	var back kill.Result
	require.NoError(t, json.Unmarshal(out.Bytes(), &back))
	assert.Equal(t, 1500*time.Microsecond, back.Waited)

	out.Reset()
	d := topology.Config{}.WithDefaults().Delay
	require.NoError(t, printJSON(&out, ops.Status{Delay: ops.DelayStatus{Levels: []ops.LevelStatus{{Queue: d.LevelQueue(7, 15), TTL: d.TTL(7, 15)}}}}))
	var s struct {
		Delay struct {
			Levels []map[string]any `json:"levels"`
		} `json:"delay"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &s), out.String())
	require.Len(t, s.Delay.Levels, 1)
	assert.Equal(t, float64(4026531840), s.Delay.Levels[0]["ttl_ms"])
	assert.NotContains(t, s.Delay.Levels[0], "ttl")
	var status ops.Status
	require.NoError(t, json.Unmarshal(out.Bytes(), &status))
	assert.Equal(t, d.TTL(7, 15), status.Delay.Levels[0].TTL)
}
