package ops

import "fmt"

// ResourceWarnAt is the share of a node's limit (file descriptors, sockets, memory) at which
// Broker.Warnings warns.
const ResourceWarnAt = 0.8

// Broker is what the management API tells of the broker as a whole (Status.Broker): its
// nodes' resources and alarms, and the policies that change warren's queues.
type Broker struct {
	Nodes []Node `json:"nodes"`
	// Policies lists the queues of warren whose effective policy changes what warren
	// declared them with.
	Policies []PolicyWarning `json:"policies,omitempty"`
}

// Node is one node of the broker, as the management API tells it.
type Node struct {
	Name    string `json:"name"`
	Running bool   `json:"running"`
	// FDUsed and FDTotal are the node's file descriptors in use and allowed; on RabbitMQ 3.x
	// the quorum queues' files count against it, and a node out of them stops answering
	// AMQP handshakes. 0 when the broker did not tell.
	FDUsed  int `json:"fd_used"`
	FDTotal int `json:"fd_total"`
	// SocketsUsed and SocketsTotal are its sockets (client connections) in use and allowed
	// (RabbitMQ 3.x; 0 when the broker did not tell).
	SocketsUsed  int `json:"sockets_used"`
	SocketsTotal int `json:"sockets_total"`
	// MemUsed and MemLimit are its memory in use and its high watermark, in bytes.
	MemUsed  int64 `json:"mem_used"`
	MemLimit int64 `json:"mem_limit"`
	// DiskFree and DiskFreeLimit are its free disk space and the limit under which the disk
	// alarm goes off, in bytes.
	DiskFree      int64 `json:"disk_free"`
	DiskFreeLimit int64 `json:"disk_free_limit"`
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
	// Keys are the policy keys that change dead-lettering, the delivery limit, TTLs or
	// delayed retry of the queue, with their values ("delivery-limit=5").
	Keys []string `json:"keys"`
}

// Warnings lists, one line each, the alarms in effect, the node resources at or above
// ResourceWarnAt of their limit, the nodes not running, and the queues a policy changes.
func (b Broker) Warnings() []string {
	var ws []string
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
		if near(int64(n.FDUsed), int64(n.FDTotal)) {
			ws = append(ws, fmt.Sprintf("%s uses %d of %d file descriptors: at the limit it stops accepting connections", n.Name, n.FDUsed, n.FDTotal))
		}
		if near(int64(n.SocketsUsed), int64(n.SocketsTotal)) {
			ws = append(ws, fmt.Sprintf("%s uses %d of %d sockets", n.Name, n.SocketsUsed, n.SocketsTotal))
		}
		if !n.MemAlarm && near(n.MemUsed, n.MemLimit) {
			ws = append(ws, fmt.Sprintf("%s uses %d%% of its memory limit", n.Name, n.MemUsed*100/n.MemLimit))
		}
	}
	for _, p := range b.Policies {
		name := p.Policy
		if p.OperatorPolicy != "" {
			name = "operator policy " + p.OperatorPolicy
		}
		ws = append(ws, fmt.Sprintf("policy %s changes queue %s: %v", name, p.Queue, p.Keys))
	}
	return ws
}

// near reports whether used is at or above ResourceWarnAt of a known limit.
func near(used, limit int64) bool {
	return limit > 0 && float64(used) >= ResourceWarnAt*float64(limit)
}
