package ops

import (
	"fmt"
	"strings"
)

// ResourceWarnAt is the share of a node's limit (file descriptors, file handles, sockets,
// memory; for the disk, of its free space taken by the alarm's floor) at which
// Broker.Warnings warns.
const ResourceWarnAt = 0.8

// Broker is what the management API tells of the broker as a whole (Status.Broker): its
// nodes' resources and alarms, and the policies that change warren's queues.
type Broker struct {
	Nodes []Node `json:"nodes"`
	// NodesUnread says why the nodes could not be read ("" when they were): the management
	// user lacks the monitoring tag. Their resources and alarms are then unchecked.
	NodesUnread string `json:"nodes_unread,omitempty"`
	// Policies lists the queues of warren whose effective policy changes what warren
	// declared them with.
	Policies []PolicyWarning `json:"policies,omitempty"`
}

// Node is one node of the broker, as the management API tells it. A figure the broker did
// not give is 0 (unknown, omitted in JSON), and no warning is drawn from it.
type Node struct {
	Name    string `json:"name"`
	Running bool   `json:"running"`
	// FDUsed and FDTotal are the node's open files as the operating system counts them, and
	// its limit. On RabbitMQ 3.x the handles its file handle cache counts for quorum queues
	// are not among FDUsed: see FileHandles.
	FDUsed  int `json:"fd_used,omitempty"`
	FDTotal int `json:"fd_total,omitempty"`
	// FileHandles and FileHandleLimit are, on RabbitMQ 3.x only, an estimate of the handles
	// its file handle cache counts (FileHandlesPerQuorumQueue per quorum queue member, plus
	// its sockets) and the cache's limit (FDTotal less what it keeps for others). Past the
	// limit the node stops answering AMQP handshakes: every client's connect times out.
	FileHandles     int `json:"file_handles,omitempty"`
	FileHandleLimit int `json:"file_handle_limit,omitempty"`
	// QuorumQueues is the number of quorum queue members the node holds, of every vhost.
	QuorumQueues int `json:"quorum_queues"`
	// SocketsUsed and SocketsTotal are its sockets (client connections) in use and allowed
	// (RabbitMQ 3.x only).
	SocketsUsed  int `json:"sockets_used,omitempty"`
	SocketsTotal int `json:"sockets_total,omitempty"`
	// MemUsed and MemLimit are its memory in use and its high watermark, in bytes.
	MemUsed  int64 `json:"mem_used,omitempty"`
	MemLimit int64 `json:"mem_limit,omitempty"`
	// DiskFree and DiskFreeLimit are its free disk space and the floor under which the disk
	// alarm goes off, in bytes.
	DiskFree      int64 `json:"disk_free,omitempty"`
	DiskFreeLimit int64 `json:"disk_free_limit,omitempty"`
	// MemAlarm and DiskAlarm are the node's resource alarms: while one is on, the broker
	// blocks every publishing connection.
	MemAlarm  bool `json:"mem_alarm"`
	DiskAlarm bool `json:"disk_alarm"`
}

// PolicyWarning is a queue of warren's that a policy changes.
type PolicyWarning struct {
	Queue string `json:"queue"`
	// Policy and OperatorPolicy name the policies in effect ("" for none).
	Policy         string `json:"policy,omitempty"`
	OperatorPolicy string `json:"operator_policy,omitempty"`
	// Keys are the keys of the effective policy that change dead-lettering, the delivery
	// limit, TTLs, overflow and length limits, or delayed retry (RabbitMQ 4.3) of the queue,
	// with their values ("delivery-limit=5").
	Keys []string `json:"keys"`
}

// fewQueues is how many queues a policy warning names before it counts the rest.
const fewQueues = 3

// Warnings lists, one line each, the alarms in effect, the node resources at or above
// ResourceWarnAt of their limit, the nodes not running, nodes that could not be read, and
// the policies that change warren's queues (one line per policy and keys, naming a few
// of its queues).
func (b Broker) Warnings() []string {
	var ws []string
	if b.NodesUnread != "" {
		ws = append(ws, "nodes not read (the management user needs the monitoring tag): their resources and alarms are unchecked")
	}
	for _, n := range b.Nodes {
		if !n.Running {
			ws = append(ws, fmt.Sprintf("node %s is not running", n.Name))
			continue
		}
		if n.MemAlarm {
			ws = append(ws, fmt.Sprintf("memory alarm on %s: publishers are blocked", n.Name))
		}
		if n.DiskAlarm {
			ws = append(ws, fmt.Sprintf("disk alarm on %s: publishers are blocked", n.Name))
		}
		if near(int64(n.FileHandles), int64(n.FileHandleLimit)) {
			ws = append(ws, fmt.Sprintf("%s holds about %d of its %d file handles (RabbitMQ 3.x: %d per quorum queue, %d quorum queues): "+
				"at the limit it stops answering connections", n.Name, n.FileHandles, n.FileHandleLimit, FileHandlesPerQuorumQueue, n.QuorumQueues))
		}
		if near(int64(n.FDUsed), int64(n.FDTotal)) {
			ws = append(ws, fmt.Sprintf("%s uses %d of %d file descriptors: at the limit it stops accepting connections", n.Name, n.FDUsed, n.FDTotal))
		}
		if near(int64(n.SocketsUsed), int64(n.SocketsTotal)) {
			ws = append(ws, fmt.Sprintf("%s uses %d of %d sockets", n.Name, n.SocketsUsed, n.SocketsTotal))
		}
		if !n.MemAlarm && near(n.MemUsed, n.MemLimit) {
			ws = append(ws, fmt.Sprintf("%s uses %d%% of its memory limit", n.Name, n.MemUsed*100/n.MemLimit))
		}
		if !n.DiskAlarm && n.DiskFree > 0 && near(n.DiskFreeLimit, n.DiskFree) {
			ws = append(ws, fmt.Sprintf("%s has %d MB of disk free, the alarm goes off under %d MB", n.Name, n.DiskFree/1e6, n.DiskFreeLimit/1e6))
		}
	}
	type group struct {
		name, keys string
		queues     []string
	}
	var groups []*group
	for _, p := range b.Policies {
		var names []string
		if p.Policy != "" {
			names = append(names, "policy "+p.Policy)
		}
		if p.OperatorPolicy != "" {
			names = append(names, "operator policy "+p.OperatorPolicy)
		}
		name, keys := strings.Join(names, " and "), strings.Join(p.Keys, ", ")
		i := len(groups)
		for j, g := range groups {
			if g.name == name && g.keys == keys {
				i = j
			}
		}
		if i == len(groups) {
			groups = append(groups, &group{name: name, keys: keys})
		}
		groups[i].queues = append(groups[i].queues, p.Queue)
	}
	for _, g := range groups {
		queues := strings.Join(g.queues[:min(len(g.queues), fewQueues)], ", ")
		if len(g.queues) > fewQueues {
			queues += fmt.Sprintf(" and %d more", len(g.queues)-fewQueues)
		}
		what := "queue " + queues
		if len(g.queues) > 1 {
			what = fmt.Sprintf("%d queues of warren's (%s)", len(g.queues), queues)
		}
		verb := "changes"
		if strings.Contains(g.name, " and ") {
			verb = "change"
		}
		ws = append(ws, fmt.Sprintf("%s %s %s: %s", g.name, verb, what, g.keys))
	}
	return ws
}

// near reports whether used is at or above ResourceWarnAt of a known limit.
func near(used, limit int64) bool {
	return limit > 0 && float64(used) >= ResourceWarnAt*float64(limit)
}
