package ops

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/warrenmq/warren/internal/mgmt"
)

// The keys that change warren's queues are told with their values, in a fixed order; the
// others are not, and neither are the delayed retry keys (RabbitMQ 4.3) while delayed retry
// is off.
func TestChangingKeys(t *testing.T) {
	assert.Equal(t, []string{"dead-letter-exchange=dlx", "delivery-limit=5", "message-ttl=1000", "max-length=100",
		"delayed-retry-type=all", "delayed-retry-min=1000", "delayed-retry-max=30000"},
		changingKeys(mgmt.Definition{"max-length": 100.0, "delivery-limit": 5.0, "message-ttl": 1000.0, "dead-letter-exchange": "dlx",
			"delayed-retry-type": "all", "delayed-retry-min": 1000.0, "delayed-retry-max": 30000.0,
			"queue-leader-locator": "balanced", "consumer-timeout": 5.0}))
	assert.Empty(t, changingKeys(mgmt.Definition{"delayed-retry-type": "disabled", "delayed-retry-min": 1000.0}))
	assert.Empty(t, changingKeys(mgmt.Definition{"delayed-retry-min": 1000.0}))
	assert.Equal(t, []string{"expires=60000", "overflow=drop-head", "max-length-bytes=10"},
		changingKeys(mgmt.Definition{"expires": 60000.0, "overflow": "drop-head", "max-length-bytes": 10.0}))
}

// The nodes' figures warn at ResourceWarnAt of their limit, a figure the broker did not give
// (0) never; a policy's queues are named on one line, a few of them.
func TestBrokerWarnings(t *testing.T) {
	b := Broker{Nodes: []Node{
		{Name: "a", Running: true, FDUsed: 10, FDTotal: 1024, FileHandles: 750, FileHandleLimit: 927, QuorumQueues: 250,
			SocketsUsed: 1, SocketsTotal: 832, MemUsed: 79, MemLimit: 100, DiskFree: 124, DiskFreeLimit: 100},
		{Name: "b", Running: true, FDUsed: 10, FDTotal: 1024, FileHandles: 740, FileHandleLimit: 927,
			MemUsed: 80, MemLimit: 100, DiskFree: 126e6, DiskFreeLimit: 100e6},
		{Name: "unknown", Running: true, FDUsed: 5},
	}, Policies: []PolicyWarning{
		{Queue: "q1", Policy: "p", Keys: []string{"message-ttl=1"}},
		{Queue: "q2", Policy: "p", Keys: []string{"message-ttl=1"}},
		{Queue: "q3", Policy: "p", Keys: []string{"message-ttl=1"}},
		{Queue: "q4", Policy: "p", Keys: []string{"message-ttl=1"}},
		{Queue: "w", Policy: "p", OperatorPolicy: "op", Keys: []string{"delivery-limit=5", "max-length=9"}},
	}}
	assert.Equal(t, []string{
		"a holds about 750 of its 927 file handles (RabbitMQ 3.x: 3 per quorum queue, 250 quorum queues): at the limit it stops answering connections",
		"a has 0 MB of disk free, the alarm goes off under 0 MB",
		"b uses 80% of its memory limit",
		"policy p changes 4 queues of warren's (q1, q2, q3 and 1 more): message-ttl=1",
		"policy p and operator policy op change queue w: delivery-limit=5, max-length=9",
	}, b.Warnings())
	assert.Equal(t, []string{"nodes not read (the management user needs the monitoring tag): their resources and alarms are unchecked"},
		Broker{NodesUnread: "401"}.Warnings())
}
