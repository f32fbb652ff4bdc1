package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Node is a RabbitMQ node of a test's own, on ports of its own, deleted when the test ends.
//
// It runs with a configuration of its own (no /etc/rabbitmq files, no plugins, an Erlang
// cookie and data directory of its own), so restarting it or dropping its connections never
// disturbs the shared broker. Its methods fail the test, so call them from the test's
// goroutine.
type Node struct {
	t    testing.TB
	name string // Erlang node name: warrentest<hex>@localhost
	dir  string // everything of the node's: data, logs, pid file, cookie, config
	port int    // AMQP
	bin  string // directory holding rabbitmq-server and rabbitmqctl
	env  []string
	// withMgmt makes the node run the management plugin, its HTTP API on port mgmt.
	withMgmt bool
	mgmt     int
	// openFiles, if not 0, is the node's limit of open files (ulimit -n).
	openFiles int
	// rabbit are more settings of the rabbit application (see WithRabbitSettings).
	rabbit []string
	// cookie is the Erlang cookie (the nodes of a cluster share one); "" until prepare
	// chooses one of the node's own.
	cookie string

	mu      sync.Mutex
	stopped bool
}

const nodeDirPrefix = "warren-node-"

// The limits of a node's start, rabbitmqctl calls, stop and exit, from Patience. Each
// rabbitmqctl call starts an Erlang VM: with two CPU-bound processes beside make test on 2
// cores, a call took over 30 s, a start over 40 s, and a cluster's three nodes starting at
// once over 2 minutes.
var (
	nodeStartLimit = 3 * Patience()
	nodeCtlLimit   = Patience()
	nodeStopLimit  = Patience() / 2
	nodeExitLimit  = Patience() / 4
)

// NodeOption is an option of StartNode.
type NodeOption func(*Node)

// WithManagement makes the node run RabbitMQ's management plugin, its HTTP API on a port of
// its own (Node.ManagementURL). It adds a few seconds to the start.
func WithManagement() NodeOption { return func(n *Node) { n.withMgmt = true } }

// WithOpenFiles starts the node with a limit of n open files (ulimit -n), as a broker that
// runs with the common default of 1,024 does. On RabbitMQ 3.x the node's file handle cache
// allows a few fewer, shared by its quorum queues and its connections.
func WithOpenFiles(n int) NodeOption { return func(node *Node) { node.openFiles = n } }

// WithRabbitSettings adds settings of the rabbit application to the node's advanced.config,
// each an Erlang tuple such as "{consumer_timeout, 1000}".
func WithRabbitSettings(settings ...string) NodeOption {
	return func(n *Node) { n.rabbit = append(n.rabbit, settings...) }
}

// StartNode starts a fresh node (fails the test if it cannot, within ~60s) and stops it and
// removes its files when t ends.
func StartNode(t testing.TB, opts ...NodeOption) *Node {
	t.Helper()
	NeedsBroker(t)
	n := newNode(t, "", opts...)
	start := time.Now()
	if err := n.launch(); err != nil {
		t.Fatal(err)
	}
	t.Logf("RabbitMQ node %s on port %d started in %v", n.name, n.port, time.Since(start).Round(time.Millisecond))
	return n
}

// newNode prepares a node's directory and files (cookie, if not empty, is its Erlang cookie;
// else it gets one of its own) without launching it, and arranges for it to be stopped and
// its files removed when t ends; it fails the test on error.
func newNode(t testing.TB, cookie string, opts ...NodeOption) *Node {
	t.Helper()
	bin, err := rabbitmqBin()
	if err != nil {
		t.Fatalf("testenv.StartNode needs a local RabbitMQ installation (rabbitmq-server and "+
			"rabbitmqctl; e.g. `apt-get install rabbitmq-server`, or $%s): %v", BinEnv, err)
	}
	sweepStaleNodes()
	dir, err := os.MkdirTemp("", nodeDirPrefix)
	if err != nil {
		t.Fatalf("node: %v", err)
	}
	n := &Node{t: t, dir: dir, bin: bin, cookie: cookie}
	for _, o := range opts {
		o(n)
	}
	// The node is stopped before its directory goes, also when starting fails.
	t.Cleanup(func() {
		n.Stop()
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("node: remove %s: %v", dir, err)
		}
	})
	if err := n.prepare(); err != nil {
		t.Fatalf("node: %v", err)
	}
	return n
}

// launch boots the prepared node for the first time, within nodeStartLimit, on other ports
// when the chosen ones were taken meanwhile (twice at most). It does not fail the test, so
// that several nodes can be launched at once.
func (n *Node) launch() error {
	ctx, cancel := context.WithTimeout(context.Background(), nodeStartLimit)
	defer cancel()
	for attempt := 1; ; attempt++ {
		err := n.boot(ctx)
		if err == nil {
			return nil
		}
		_ = n.kill(5 * time.Second) // and let it finish writing its logs
		logs := n.logTail()
		// A port taken between choosing it and the node binding it: try other ports.
		if attempt < 3 && ctx.Err() == nil && n.portClash() {
			n.t.Logf("node %s: port taken, retrying with other ports", n.name)
			_ = os.RemoveAll(filepath.Join(n.dir, "mnesia"))
			_ = os.RemoveAll(filepath.Join(n.dir, "log"))
			_ = os.Remove(filepath.Join(n.dir, "erl_crash.dump"))
			_ = os.Remove(filepath.Join(n.dir, "pid"))
			_ = os.Remove(filepath.Join(n.dir, "startup.log"))
			if err := n.choosePorts(); err != nil {
				return fmt.Errorf("node: %w", err)
			}
			continue
		}
		return fmt.Errorf("start RabbitMQ node %s on port %d: %w\n%s", n.name, n.port, err, logs)
	}
}

// URL is the node's AMQP URL: amqp://guest:guest@127.0.0.1:<port>/.
func (n *Node) URL() string { return "amqp://guest:guest@" + n.Addr() + "/" }

// Addr is the node's AMQP host:port (a target for NewProxy).
func (n *Node) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)) }

// Port is the node's AMQP port.
func (n *Node) Port() int { return n.port }

// ManagementURL is the URL of the node's management HTTP API, with guest's credentials:
// http://guest:guest@127.0.0.1:<port>/. It fails the test for a node started without
// WithManagement.
func (n *Node) ManagementURL() string {
	n.t.Helper()
	if n.mgmt == 0 {
		n.t.Fatalf("node %s runs no management plugin (StartNode(t, testenv.WithManagement()))", n.name)
	}
	return "http://guest:guest@" + net.JoinHostPort("127.0.0.1", strconv.Itoa(n.mgmt)) + "/"
}

// Name is the node's Erlang node name.
func (n *Node) Name() string { return n.name }

// Ctl runs rabbitmqctl -n <node> args... (for at most 30s) and returns its combined output.
func (n *Node) Ctl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), nodeCtlLimit)
	defer cancel()
	return n.ctl(ctx, args...)
}

// CloseAllConnections closes every client connection to the node (in all virtual hosts),
// as an operator would; fails the test on error.
func (n *Node) CloseAllConnections() {
	n.t.Helper()
	if out, err := n.Ctl("close_all_connections", "--global", "test"); err != nil {
		n.t.Fatalf("node %s: %v\n%s", n.name, err, out)
	}
}

// Restart stops the RabbitMQ application and starts it again (the Erlang VM stays up: durable
// queues and persistent messages survive, connections do not), and returns once the AMQP port
// answers again; fails the test on error.
func (n *Node) Restart() {
	n.t.Helper()
	if out, err := n.Ctl("stop_app"); err != nil {
		n.t.Fatalf("node %s: %v\n%s", n.name, err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), nodeStartLimit)
	defer cancel()
	if out, err := n.ctl(ctx, "start_app"); err != nil {
		n.t.Fatalf("node %s: %v\n%s\n%s", n.name, err, out, n.logTail())
	}
	if err := n.awaitUp(ctx, time.Now()); err != nil {
		n.t.Fatalf("node %s: %v\n%s", n.name, err, n.logTail())
	}
}

// Crash kills every process of the node with SIGKILL (kill -9: no clean shutdown, only what
// the broker had written survives), then boots it again on the same ports and data
// directory and returns once it answers; fails the test on error.
func (n *Node) Crash() {
	n.t.Helper()
	n.Kill()
	n.Boot()
}

// Kill kills every process of the node with SIGKILL (kill -9: no clean shutdown, only what
// the broker had written survives) and returns once they are gone; the node stays down until
// Boot. It fails the test on error.
func (n *Node) Kill() {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		n.t.Fatalf("node %s: Kill after Stop", n.name)
	}
	pids := n.processes()
	if len(pids) == 0 {
		n.t.Fatalf("node %s: Kill: no process is running", n.name)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			n.t.Fatalf("node %s: kill -9 %d: %v", n.name, pid, err)
		}
	}
	if err := n.kill(nodeExitLimit); err != nil {
		n.t.Fatalf("node %s: after kill -9: %v", n.name, err)
	}
	// The killed node's pid file would make boot think the new one died.
	if err := os.Remove(filepath.Join(n.dir, "pid")); err != nil && !errors.Is(err, os.ErrNotExist) {
		n.t.Fatalf("node %s: %v", n.name, err)
	}
}

// Boot starts a node that Kill left down, on the same ports and data directory (a node of a
// cluster rejoins it), and returns once it answers; fails the test on error.
func (n *Node) Boot() {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		n.t.Fatalf("node %s: Boot after Stop", n.name)
	}
	if pids := n.processes(); len(pids) > 0 {
		n.t.Fatalf("node %s: Boot: processes %v still run", n.name, pids)
	}
	ctx, cancel := context.WithTimeout(context.Background(), nodeStartLimit)
	defer cancel()
	if err := n.boot(ctx); err != nil {
		n.t.Fatalf("node %s: start after kill -9: %v\n%s", n.name, err, n.logTail())
	}
}

// Stop stops the node (killing it if it does not stop in time). It is idempotent and also
// runs when the test ends.
func (n *Node) Stop() {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.stopped {
		return
	}
	n.stopped = true
	if n.env == nil {
		return // never launched
	}
	if len(n.processes()) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), nodeStopLimit)
		_, _ = n.ctl(ctx, "stop")
		cancel()
	}
	if err := n.kill(nodeExitLimit); err != nil {
		n.t.Errorf("node %s: %v", n.name, err)
	}
}

// AdvancedConfig is the advanced.config of the nodes StartNode starts: the broker setting
// warren recommends (docs/clusters.md, Broker settings). A quorum queue's dead-letter worker waits
// dead_letter_worker_publisher_confirm_timeout (180 s by default) before it sends again what
// it was dead-lettering when the broker crashed: with warren's quorum delay levels, measured
// here on 3.10.8 and 4.0.5, 149 of 1,000 delayed messages arrived 180 s late (none lost);
// with 5 s, all within 4.2 s of the restart.
const AdvancedConfig = "[{rabbit, [" + advancedRabbit + "]}].\n"

const advancedRabbit = "{dead_letter_worker_publisher_confirm_timeout, 5000}"

// StopQueue stops the Raft member of quorum queue q (default virtual host) on the node, as
// a crash of it would: the queue is down until the node restarts. A passive declare of it
// still answers, counting 0 messages; consuming from it is refused with 541 INTERNAL_ERROR,
// which closes the connection. It fails the test on error.
func (n *Node) StopQueue(q string) {
	n.t.Helper()
	expr := fmt.Sprintf(`{ok, Q} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, <<"%s">>)), `+
		`{Name, _} = amqqueue:get_pid(Q), ra:stop_server(quorum_queues, {Name, node()}).`, q)
	if out, err := n.Ctl("eval", expr); err != nil || strings.TrimSpace(out) != "ok" {
		n.t.Fatalf("node %s: stop queue %s: %v\n%s", n.name, q, err, out)
	}
}
