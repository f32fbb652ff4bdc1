package ops

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/mgmt"
	"github.com/warrenmq/warren/topology"
)

// FileHandlesPerQuorumQueue is how many file handles RabbitMQ 3.x's file handle cache
// counts for each quorum queue member a node holds (measured on 3.10.8: see
// docs/decisions.md). The operating system's count of open files (Node.FDUsed) does not show
// them.
const FileHandlesPerQuorumQueue = 3

// fileHandleReserve is how many of its open files (fd_total) RabbitMQ 3.x keeps out of its
// file handle cache's limit (measured: docs/decisions.md).
const fileHandleReserve = 97

// policyKeys are the policy keys that change what warren declares its queues with:
// dead-lettering, the delivery limit, TTLs, overflow and length limits, and RabbitMQ 4.3's
// delayed retry (with which a message handed back returns late, and is not counted ready
// meanwhile).
var policyKeys = []string{
	"dead-letter-exchange", "dead-letter-routing-key", "dead-letter-strategy",
	"delivery-limit",
	"message-ttl", "expires",
	"overflow", "max-length", "max-length-bytes",
	"delayed-retry-type", "delayed-retry-min", "delayed-retry-max",
}

// changingKeys returns the keys of def among policyKeys, "key=value" each, in order. The
// delayed retry keys count only when delayed-retry-type is set to other than "disabled".
func changingKeys(def mgmt.Definition) []string {
	retry, _ := def["delayed-retry-type"].(string)
	var keys []string
	for _, k := range policyKeys {
		v, ok := def[k]
		if !ok || strings.HasPrefix(k, "delayed-retry-") && (retry == "" || retry == "disabled") {
			continue
		}
		keys = append(keys, fmt.Sprintf("%s=%v", k, v))
	}
	return keys
}

// policyWarnings returns the queues among names that all has and whose effective policy
// has a key of policyKeys, in the order of names.
func policyWarnings(all map[string]mgmt.Queue, names []string) []PolicyWarning {
	var ws []PolicyWarning
	for _, name := range names {
		q, ok := all[name]
		if !ok || len(q.EffectivePolicy) == 0 {
			continue
		}
		if keys := changingKeys(q.EffectivePolicy); len(keys) > 0 {
			ws = append(ws, PolicyWarning{Queue: name, Policy: q.Policy, OperatorPolicy: q.OperatorPolicy, Keys: keys})
		}
	}
	return ws
}

// readNodes returns the broker's nodes as the management API tells them, with the file
// handles of each one's quorum queue members when version (the broker's) has a file handle
// cache. A management user who may not read the nodes (the monitoring tag) leaves Nodes
// empty and says so in NodesUnread.
func (o *Ops) readNodes(ctx context.Context, version string) (*Broker, error) {
	b := &Broker{}
	ns, err := o.mgmt.Nodes(ctx)
	if errors.Is(err, mgmt.ErrNotAllowed) {
		b.NodesUnread = err.Error()
		return b, nil
	}
	if err != nil {
		return nil, err
	}
	members, err := o.mgmt.QuorumMembers(ctx)
	if err != nil {
		return nil, err
	}
	cache := amqpx.FileHandleCache(version)
	for _, n := range ns {
		node := Node{Name: n.Name, Running: n.Running, MemAlarm: n.MemAlarm, DiskAlarm: n.DiskFreeAlarm,
			FDUsed: int(value(n.FDUsed)), FDTotal: int(value(n.FDTotal)),
			SocketsUsed: int(value(n.SocketsUsed)), SocketsTotal: int(value(n.SocketsTotal)),
			MemUsed: value(n.MemUsed), MemLimit: value(n.MemLimit),
			DiskFree: value(n.DiskFree), DiskFreeLimit: value(n.DiskFreeLimit),
			QuorumQueues: members[n.Name]}
		if cache && node.FDTotal > fileHandleReserve {
			node.FileHandleLimit = node.FDTotal - fileHandleReserve
			node.FileHandles = FileHandlesPerQuorumQueue*node.QuorumQueues + node.SocketsUsed
		}
		b.Nodes = append(b.Nodes, node)
	}
	return b, nil
}

// value is *v, 0 for nil (a figure the broker did not give).
func value(v *int64) int64 {
	if v == nil {
		return 0
	}
	return *v
}

// warrensQueues lists the queues of s that warren declared: each work queue and its poison
// queue, then the delay levels and the parking queue.
func warrensQueues(s *Status, d topology.Delay) []string {
	var names []string
	for _, q := range s.Queues {
		names = append(names, q.Queue, topology.PoisonQueue(q.Queue))
	}
	for _, l := range s.Delay.Levels {
		names = append(names, l.Queue)
	}
	return append(names, d.ParkingQueue())
}

// HandleCheck is what declaring quorum queues would do to the file handles of a RabbitMQ
// 3.x broker (see Ops.CheckFileHandles).
type HandleCheck struct {
	// ServerVersion is the broker's version.
	ServerVersion string
	// Cache tells whether that version counts file handles (RabbitMQ 3.x); without it, the
	// rest is empty.
	Cache bool
	// New is the number of quorum queues to declare that do not exist yet; -1 when unknown
	// (no management API).
	New int
	// Nodes are the running nodes, as they are before the queues are declared; empty without
	// the management API.
	Nodes []Node
	// Warnings lists, one line each, the nodes the new queues would take to ResourceWarnAt
	// of their file handle limit or past it, and those whose limit is unknown.
	Warnings []string
	// Exhausts tells whether the new queues would take a node past its limit: it would then
	// stop answering connections, for every client.
	Exhausts bool
}

// CheckFileHandles says what declaring the quorum queues named (those that do not exist yet)
// would do to the file handles of a RabbitMQ 3.x broker's nodes, each of which holds a member
// of each new queue (as it does up to the broker's default group size), with the management
// API (Config.Management). Without it, it tells the version only.
func (o *Ops) CheckFileHandles(ctx context.Context, quorumQueues []string) (HandleCheck, error) {
	c := HandleCheck{New: -1}
	err := o.call(ctx, "ops: check file handles", func(ctx context.Context, _ *amqp.Channel) error {
		conn, err := o.connection(ctx)
		if err != nil {
			return err
		}
		c.ServerVersion = amqpx.ServerVersion(conn)
		return nil
	})
	if err != nil || o.mgmt == nil {
		c.Cache = amqpx.FileHandleCache(c.ServerVersion)
		return c, err
	}
	c.Cache = amqpx.FileHandleCache(c.ServerVersion)
	if !c.Cache {
		return c, nil
	}
	ctx, cancel := context.WithTimeout(ctx, o.cfg.Timeout)
	defer cancel()
	b, err := o.readNodes(ctx, c.ServerVersion)
	if err != nil {
		return c, fmt.Errorf("ops: check file handles: %w", err)
	}
	all, err := o.mgmt.Queues(ctx, o.vhost)
	if err != nil {
		return c, fmt.Errorf("ops: check file handles: %w", err)
	}
	existing := make(map[string]bool, len(all))
	for _, q := range all {
		existing[q.Name] = true
	}
	c.New = 0
	for _, q := range quorumQueues {
		if !existing[q] {
			c.New++
		}
	}
	for _, n := range b.Nodes {
		if !n.Running {
			continue
		}
		if n.FileHandleLimit <= 0 {
			if c.New > 0 {
				c.Warnings = append(c.Warnings, fmt.Sprintf("the management API does not tell %s's open-file limit (yet: a node just started): "+
					"what %d new quorum queues take of its file handles is unchecked", n.Name, c.New))
			}
			continue
		}
		c.Nodes = append(c.Nodes, n)
		after := n.FileHandles + FileHandlesPerQuorumQueue*c.New
		switch {
		case c.New == 0:
		case after >= n.FileHandleLimit:
			c.Exhausts = true
			c.Warnings = append(c.Warnings, fmt.Sprintf("%d new quorum queues would take %s to about %d file handles, past its limit of %d: "+
				"it would stop answering connections, for every client (raise its open-file limit: docs/operating.md)",
				c.New, n.Name, after, n.FileHandleLimit))
		case near(int64(after), int64(n.FileHandleLimit)):
			c.Warnings = append(c.Warnings, fmt.Sprintf("%d new quorum queues take %s to about %d of its %d file handles "+
				"(at the limit it stops answering connections; docs/operating.md)", c.New, n.Name, after, n.FileHandleLimit))
		}
	}
	slices.Sort(c.Warnings)
	return c, nil
}

// addBroker sets s.Broker: the nodes (readNodes) and the policies that change warren's
// queues (of all, the vhost's queues by name).
func (o *Ops) addBroker(ctx context.Context, s *Status, all map[string]mgmt.Queue) error {
	b, err := o.readNodes(ctx, s.ServerVersion)
	if err != nil {
		return err
	}
	b.Policies = policyWarnings(all, warrensQueues(s, o.cfg.Delay))
	s.Broker = b
	return nil
}
