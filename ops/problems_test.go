package ops

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/warrenmq/warren/kill"
)

func TestProblems(t *testing.T) {
	s := Status{
		ServerVersion: "3.10.8", Warning: "hazard",
		Queues: []QueueStatus{
			{Queue: "ok", Exists: true, Consumers: 2, Poison: 0},
			{Queue: "poisoned", Exists: true, Consumers: 1, Poison: 2, Held: 2},
			{Queue: "idle", Exists: true, Poison: -1},
			{Queue: "stopped", Exists: true, Kill: kill.Stop, Poison: 1},
			{Queue: "resumed", Exists: true, Kill: kill.Resume, Consumers: 1},
			{Queue: "gone"},
			{Queue: "minority", Exists: true, State: "minority", Consumers: 1},
		},
		Delay: DelayStatus{Name: "d", Levels: make([]LevelStatus, 3), Missing: 1, Parked: 1},
		Broker: &Broker{Nodes: []Node{
			{Name: "rabbit@a", Running: true, FDUsed: 900, FDTotal: 1000, MemUsed: 1, MemLimit: 10, DiskAlarm: true},
			{Name: "rabbit@b"},
		}, Policies: []PolicyWarning{{Queue: "q", Policy: "lim", Keys: []string{"delivery-limit=5"}}}},
	}
	assert.Equal(t, []Problem{
		{Kind: ProblemPoison, Queue: "poisoned", Text: "2 poison messages"},
		{Kind: ProblemHeld, Queue: "poisoned", Text: "2 held keys (warren held list poisoned)"},
		{Kind: ProblemNoConsumer, Queue: "idle", Text: "no consumer"},
		{Kind: ProblemPoison, Queue: "stopped", Text: "1 poison message"},
		{Kind: ProblemKilled, Queue: "stopped", Text: "killed (stop)"},
		{Kind: ProblemMissing, Queue: "gone", Text: "no such queue"},
		{Kind: ProblemDown, Queue: "minority", Text: "minority"},
		{Kind: ProblemDelay, Text: "1 of 3 delay level queues missing"},
		{Kind: ProblemDelay, Text: "1 parked message"},
		{Kind: ProblemBroker, Text: "disk alarm on rabbit@a: publishers are blocked"},
		{Kind: ProblemBroker, Text: "rabbit@a uses 900 of 1000 file descriptors: at the limit it stops accepting connections"},
		{Kind: ProblemBroker, Text: "node rabbit@b is not running"},
		{Kind: ProblemBroker, Text: "policy lim changes queue q: delivery-limit=5"},
		{Kind: ProblemVersion, Text: "RabbitMQ 3.10.8 can stop dead-lettering on one malformed message"},
	}, s.Problems())
	assert.Nil(t, Status{Delay: DelayStatus{Parked: -1}}.Problems())
}
