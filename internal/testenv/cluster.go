package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Cluster is a RabbitMQ cluster of throwaway nodes (see Node), deleted when the test ends.
// Each node can be killed (Node.Kill, Node.Crash) and booted again (Node.Boot) on its own.
type Cluster struct {
	// Nodes are the cluster's nodes; the first is the one the others joined.
	Nodes []*Node
	// Started is how long starting and joining the nodes took.
	Started time.Duration
}

// clusterJoinLimit bounds joining one node to the cluster (stop_app, join_cluster, start_app).
var clusterJoinLimit = 3 * Patience()

// StartCluster starts size fresh nodes (as StartNode does, with one Erlang cookie), joins the
// others to the first (rabbitmqctl stop_app; join_cluster; start_app, one node at a time),
// checks that every node sees all of them running, and logs how long it took. It fails the
// test if it cannot. When t ends the nodes are killed (they are throwaway: no clean
// shutdown is waited for) and their files removed.
func StartCluster(t testing.TB, size int) *Cluster {
	t.Helper()
	NeedsBroker(t)
	if size < 1 {
		t.Fatalf("StartCluster: size %d", size)
	}
	start := time.Now()
	cookie := newCookie()
	c := &Cluster{}
	for range size {
		c.Nodes = append(c.Nodes, newNode(t, cookie))
	}
	// Registered after the nodes' own clean-ups, so it runs before them: every node is
	// killed at once rather than stopped one after the other.
	t.Cleanup(c.halt)

	// Boot every node at once; each retries with other ports on a port clash.
	errs := make([]error, size)
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		wg.Go(func() { errs[i] = n.launch() })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	booted := time.Since(start)

	first := c.Nodes[0]
	for _, n := range c.Nodes[1:] {
		if err := n.join(first.name); err != nil {
			t.Fatalf("cluster: %v\n%s", err, n.logTail())
		}
	}
	for _, n := range c.Nodes {
		running, err := n.runningNodes()
		if err != nil {
			t.Fatalf("cluster: %v", err)
		}
		if len(running) != size {
			t.Fatalf("cluster: node %s sees %d running nodes %v, want %d", n.name, len(running), running, size)
		}
	}
	c.Started = time.Since(start)
	var ports []string
	for _, n := range c.Nodes {
		ports = append(ports, fmt.Sprint(n.port))
	}
	t.Logf("RabbitMQ cluster of %d nodes (AMQP ports %s) started in %v (nodes booted in %v, joined in %v)",
		size, strings.Join(ports, ", "), c.Started.Round(time.Millisecond), booted.Round(time.Millisecond),
		(c.Started - booted).Round(time.Millisecond))
	return c
}

// URL is the AMQP URLs of every node, separated by commas (what warren's URL fields take).
func (c *Cluster) URL() string {
	urls := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		urls[i] = n.URL()
	}
	return strings.Join(urls, ",")
}

// NodeByName returns the node whose Erlang node name is name, or nil.
func (c *Cluster) NodeByName(name string) *Node {
	for _, n := range c.Nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// NodeByPort returns the node whose AMQP port is port, or nil.
func (c *Cluster) NodeByPort(port int) *Node {
	for _, n := range c.Nodes {
		if n.port == port {
			return n
		}
	}
	return nil
}

// Up returns the nodes that are running (not killed or stopped), in order.
func (c *Cluster) Up() []*Node {
	var up []*Node
	for _, n := range c.Nodes {
		n.mu.Lock()
		running := !n.stopped && len(n.processes()) > 0
		n.mu.Unlock()
		if running {
			up = append(up, n)
		}
	}
	return up
}

// Ctl runs rabbitmqctl args... on the first node that is up (for at most 30s) and returns its
// combined output.
func (c *Cluster) Ctl(args ...string) (string, error) {
	up := c.Up()
	if len(up) == 0 {
		return "", fmt.Errorf("rabbitmqctl %s: no node of the cluster is up", strings.Join(args, " "))
	}
	return up[0].Ctl(args...)
}

// join makes n a member of the cluster of the node named seed. It retries join_cluster a few
// times: right after a boot, the seed may still refuse it for a moment.
func (n *Node) join(seed string) error {
	ctx, cancel := context.WithTimeout(context.Background(), clusterJoinLimit)
	defer cancel()
	if out, err := n.ctl(ctx, "stop_app"); err != nil {
		return fmt.Errorf("node %s: %w\n%s", n.name, err, out)
	}
	for attempt := 1; ; attempt++ {
		out, err := n.ctl(ctx, "join_cluster", seed)
		if err == nil {
			break
		}
		if attempt == 5 || ctx.Err() != nil {
			return fmt.Errorf("node %s: %w\n%s", n.name, err, out)
		}
		n.t.Logf("node %s: join_cluster %s failed (%v), retrying: %s", n.name, seed, err, strings.TrimSpace(out))
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	if out, err := n.ctl(ctx, "start_app"); err != nil {
		return fmt.Errorf("node %s: %w\n%s", n.name, err, out)
	}
	return n.awaitUp(ctx, time.Now())
}

// runningNodes returns the names of the cluster's nodes that n sees running.
func (n *Node) runningNodes() ([]string, error) {
	out, err := n.Ctl("cluster_status", "--formatter", "json")
	if err != nil {
		return nil, fmt.Errorf("node %s: %w\n%s", n.name, err, out)
	}
	var st struct {
		Running []string `json:"running_nodes"`
	}
	if err := DecodeCtlJSON(out, &st); err != nil {
		return nil, fmt.Errorf("node %s: cluster_status: %w\n%s", n.name, err, out)
	}
	slices.Sort(st.Running)
	return st.Running, nil
}

// DecodeCtlJSON decodes into v the JSON document that rabbitmqctl ... --formatter json
// printed in out, after whatever lines it printed before it.
func DecodeCtlJSON(out string, v any) error {
	if i := strings.IndexAny(out, "[{"); i > 0 {
		out = out[i:]
	}
	return json.Unmarshal([]byte(out), v)
}

// halt kills every node of the cluster at once (SIGKILL) and marks them stopped; the nodes'
// own clean-ups then only remove their files.
func (c *Cluster) halt() {
	var wg sync.WaitGroup
	for _, n := range c.Nodes {
		wg.Go(func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			if n.stopped {
				return
			}
			n.stopped = true
			for _, pid := range n.processes() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			if err := n.kill(nodeExitLimit); err != nil {
				n.t.Errorf("node %s: %v", n.name, err)
			}
		})
	}
	wg.Wait()
}
