package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The processes of a throwaway node: its files, ports, boot and shutdown, and finding (and
// sweeping) the processes of nodes that a killed test left behind.

// advancedConfig is the node's advanced.config: AdvancedConfig with its own rabbit settings.
func (n *Node) advancedConfig() string {
	return "[{rabbit, [" + strings.Join(append([]string{advancedRabbit}, n.rabbit...), ", ") + "]}].\n"
}

// prepare chooses a name and ports and writes the node's files.
func (n *Node) prepare() error {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	n.name = "warrentest" + hex.EncodeToString(b) + "@localhost"
	files := map[string]string{
		"owner":             strconv.Itoa(os.Getpid()), // see sweepStaleNodes
		"advanced.config":   n.advancedConfig(),
		"rabbitmq-env.conf": "", // instead of /etc/rabbitmq/rabbitmq-env.conf
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(n.dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	// A cookie of the node's own (or its cluster's); rabbitmqctl finds it through HOME as
	// well.
	if n.cookie == "" {
		n.cookie = newCookie()
	}
	if err := os.WriteFile(filepath.Join(n.dir, ".erlang.cookie"), []byte(n.cookie), 0o400); err != nil {
		return err
	}
	return n.choosePorts()
}

// newCookie returns a random Erlang cookie.
func newCookie() string {
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	return strings.ToUpper(hex.EncodeToString(b))
}

// choosePorts picks free AMQP and distribution ports (and a management port, for a node
// WithManagement) and sets the environment and configuration to match.
func (n *Node) choosePorts() error {
	k := 2
	if n.withMgmt {
		k = 3
	}
	ports, err := freePorts(k)
	if err != nil {
		return err
	}
	n.port = ports[0]
	conf, plugins := "", "[]."
	if n.withMgmt {
		n.mgmt = ports[2]
		conf = fmt.Sprintf("management.tcp.ip = 127.0.0.1\nmanagement.tcp.port = %d\n", n.mgmt)
		plugins = "[rabbitmq_management]."
	}
	for name, content := range map[string]string{"rabbitmq.conf": conf, "enabled_plugins": plugins} {
		if err := os.WriteFile(filepath.Join(n.dir, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "RABBITMQ_"), strings.HasPrefix(k, "ERL_"), k == "HOME":
			continue
		}
		env = append(env, kv)
	}
	f := func(name string) string { return filepath.Join(n.dir, name) }
	n.env = append(env,
		"HOME="+n.dir,
		"RABBITMQ_NODENAME="+n.name,
		"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
		"RABBITMQ_NODE_PORT="+strconv.Itoa(ports[0]),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(ports[1]),
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
		// rabbitmqctl's own distribution ports default to the fixed range 35672-35682,
		// which parallel tests would fight over: let the system choose.
		"RABBITMQ_CTL_DIST_PORT_MIN=0",
		"RABBITMQ_CTL_DIST_PORT_MAX=0",
		"RABBITMQ_MNESIA_BASE="+f("mnesia"),
		"RABBITMQ_LOG_BASE="+f("log"),
		"RABBITMQ_PID_FILE="+f("pid"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+f("enabled_plugins"),
		"RABBITMQ_CONFIG_FILE="+f("rabbitmq.conf"),
		"RABBITMQ_ADVANCED_CONFIG_FILE="+f("advanced.config"),
		"RABBITMQ_CONF_ENV_FILE="+f("rabbitmq-env.conf"),
		"ERL_EPMD_ADDRESS=127.0.0.1",
		"ERL_CRASH_DUMP="+f("erl_crash.dump"),
	)
	return nil
}

// boot launches the node and waits until it has started.
func (n *Node) boot(ctx context.Context) error {
	out, err := os.OpenFile(filepath.Join(n.dir, "startup.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	launchCtx, cancel := context.WithTimeout(ctx, nodeCtlLimit)
	defer cancel()
	cmd := exec.CommandContext(launchCtx, filepath.Join(n.bin, "rabbitmq-server"), "-detached")
	if n.openFiles > 0 {
		cmd = exec.CommandContext(launchCtx, "sh", "-c", `ulimit -n "$1" && exec "$2" -detached`, "sh",
			strconv.Itoa(n.openFiles), filepath.Join(n.bin, "rabbitmq-server"))
	}
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = n.dir, n.env, out, out
	cmd.WaitDelay = 5 * time.Second
	launched := time.Now()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("rabbitmq-server -detached: %w", err)
	}
	return n.awaitUp(ctx, launched)
}

// awaitUp waits until rabbitmqctl await_startup returns and the AMQP port (and the management
// port, if any) answers. (The port alone proves nothing: it may be someone else's, taken
// since it was chosen.)
func (n *Node) awaitUp(ctx context.Context, launched time.Time) error {
	var last error
	for {
		if why := n.died(launched); why != "" {
			return errors.New(why)
		}
		// Once the pid file is written the node is reachable and await_startup can wait
		// for it; before, rabbitmqctl would just find no node.
		if n.pidFromFile() > 0 {
			secs := "60"
			if d, ok := ctx.Deadline(); ok {
				secs = strconv.Itoa(max(1, int(time.Until(d).Seconds())))
			}
			out, err := n.ctl(ctx, "await_startup", "--timeout", secs)
			if err == nil {
				break
			}
			last = fmt.Errorf("%w\n%s", err, out)
		}
		select {
		case <-ctx.Done():
			if last == nil {
				last = ctx.Err()
			}
			return fmt.Errorf("node did not start: %w", last)
		case <-time.After(200 * time.Millisecond):
		}
	}
	ports := []int{n.port}
	if n.withMgmt {
		ports = append(ports, n.mgmt)
	}
	for _, port := range ports {
		for {
			c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
			if err == nil {
				_ = c.Close()
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("port %d does not answer: %w", port, err)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	return nil
}

// died tells why the node is known to have exited, or "".
func (n *Node) died(launched time.Time) string {
	if fi, err := os.Stat(filepath.Join(n.dir, "erl_crash.dump")); err == nil && !fi.ModTime().Before(launched) {
		return "node crashed (erl_crash.dump written)"
	}
	if pid := n.pidFromFile(); pid > 0 && !alive(pid) {
		return fmt.Sprintf("node process %d exited", pid)
	}
	if procFS() && time.Since(launched) > 3*time.Second && len(n.processes()) == 0 {
		return "node process exited"
	}
	return ""
}

// ctl runs rabbitmqctl -n <node> args... within ctx.
func (n *Node) ctl(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(n.bin, "rabbitmqctl"), append([]string{"-n", n.name}, args...)...)
	// The CLI is an Erlang VM too: its crash dump goes elsewhere than the node's, which died
	// takes for the node's own.
	cmd.Dir, cmd.Env = n.dir, append(slices.Clone(n.env), "ERL_CRASH_DUMP="+filepath.Join(n.dir, "ctl_crash.dump"))
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		err = fmt.Errorf("rabbitmqctl %s: %w", strings.Join(args, " "), err)
	}
	return string(out), err
}

// kill waits for the node's processes to exit, killing them if they do not within grace.
func (n *Node) kill(grace time.Duration) error {
	deadline := time.Now().Add(grace)
	killed := false
	for {
		pids := n.processes()
		if len(pids) == 0 {
			return nil
		}
		if !killed && time.Now().After(deadline) {
			for _, pid := range pids {
				if p, err := os.FindProcess(pid); err == nil {
					_ = p.Kill()
					_ = p.Release()
				}
			}
			killed, deadline = true, time.Now().Add(5*time.Second)
		} else if killed && time.Now().After(deadline) {
			return fmt.Errorf("processes %v do not exit", pids)
		}
		time.Sleep(100 * time.Millisecond) // polls: the node's processes are not our children, no exit to wait on
	}
}

// processes returns the live processes of the node: the one of its pid file, and (where
// /proc exists) every process whose command line names the node's directory (erl passes
// -home <dir>).
func (n *Node) processes() []int {
	var pids []int
	if pid := n.pidFromFile(); pid > 0 && alive(pid) && (!procFS() || cmdlineHas(pid, n.dir)) {
		pids = append(pids, pid)
	}
	for _, pid := range procsWith(n.dir) {
		if len(pids) == 0 || pid != pids[0] {
			pids = append(pids, pid)
		}
	}
	return pids
}

func (n *Node) pidFromFile() int { return readPID(filepath.Join(n.dir, "pid")) }

// logTail returns the end of the node's startup output and log, for failure messages.
func (n *Node) logTail() string {
	var b strings.Builder
	paths := []string{filepath.Join(n.dir, "startup.log")}
	logs, _ := filepath.Glob(filepath.Join(n.dir, "log", "*.log"))
	paths = append(paths, logs...)
	for _, p := range paths {
		data, err := fileTail(p)
		if err != nil || len(bytes.TrimSpace(data)) == 0 {
			continue
		}
		fmt.Fprintf(&b, "--- %s:\n%s\n", filepath.Base(p), data)
	}
	// Why the VM ended, where nothing else may say (stdout is gone when detached).
	if dump, err := os.ReadFile(filepath.Join(n.dir, "erl_crash.dump")); err == nil {
		for _, line := range strings.SplitN(string(dump), "\n", 10) {
			if strings.HasPrefix(line, "Slogan: ") {
				fmt.Fprintf(&b, "--- erl_crash.dump:\n%s\n", line)
			}
		}
	}
	return b.String()
}

// portClash tells whether the node failed for a port in use.
func (n *Node) portClash() bool {
	paths, _ := filepath.Glob(filepath.Join(n.dir, "log", "*.log"))
	paths = append(paths, filepath.Join(n.dir, "erl_crash.dump"))
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		b := make([]byte, 1<<20)
		k, _ := io.ReadFull(f, b)
		_ = f.Close()
		if bytes.Contains(b[:k], []byte("eaddrinuse")) || bytes.Contains(b[:k], []byte("dist_port_already_used")) {
			return true
		}
	}
	return false
}

// BinEnv names the environment variable that, when set, is the directory of the
// rabbitmq-server and rabbitmqctl that throwaway nodes run (another RabbitMQ installation
// than the system's, e.g. PREFIX/root/usr/lib/rabbitmq/bin of scripts/rabbitmq4.sh, with
// PREFIX/root/usr/lib/erlang/bin first in PATH: see the Makefile's cluster target; not
// PREFIX/bin, whose wrappers reset the RABBITMQ_* variables a node is set up with).
const BinEnv = "WARREN_RABBITMQ_BIN"

// rabbitmqBin finds the directory of the rabbitmq-server and rabbitmqctl scripts: $BinEnv,
// else the system's. Debian's /usr/sbin ones switch to the rabbitmq user (which could not
// use a test's directory), so the scripts they wrap are preferred.
func rabbitmqBin() (string, error) {
	ok := func(dir string) bool { return hasFiles(dir, "rabbitmq-server", "rabbitmqctl") }
	if dir := os.Getenv(BinEnv); dir != "" {
		if !ok(dir) {
			return "", fmt.Errorf("$%s=%s holds no rabbitmq-server and rabbitmqctl", BinEnv, dir)
		}
		return dir, nil
	}
	if ok("/usr/lib/rabbitmq/bin") {
		return "/usr/lib/rabbitmq/bin", nil
	}
	p, err := exec.LookPath("rabbitmq-server")
	if err != nil {
		return "", err
	}
	if dir := filepath.Dir(p); ok(dir) {
		return dir, nil
	}
	return "", fmt.Errorf("no rabbitmqctl next to %s", p)
}

// freePorts returns k distinct ports free on 127.0.0.1 just now.
func freePorts(k int) ([]int, error) {
	var ports []int
	for range k {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// sweepStaleNodes stops the nodes, and removes the directories, left by test processes that
// ended without cleaning up (killed, or timed out).
func sweepStaleNodes() {
	if !procFS() {
		return
	}
	for _, dir := range staleDirs(nodeDirPrefix) {
		for _, pid := range procsWith(dir) {
			if p, err := os.FindProcess(pid); err == nil {
				_ = p.Kill()
				_ = p.Release()
			}
		}
		_ = os.RemoveAll(dir)
	}
}

// staleDirs returns the directories of the system's temporary one named prefix* whose test
// process has ended (the pid in their file owner is gone), and those without an owner file
// that are older than 10 minutes (a test starting now has not written it yet).
func staleDirs(prefix string) []string {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	var stale []string
	for _, dir := range dirs {
		if owner := readPID(filepath.Join(dir, "owner")); owner == 0 {
			if st, err := os.Stat(dir); err != nil || time.Since(st.ModTime()) < 10*time.Minute {
				continue
			}
		} else if owner < 0 || alive(owner) {
			continue
		}
		stale = append(stale, dir)
	}
	return stale
}

// readPID returns the process id on the first line of the file at path, 0 when the file
// cannot be read or holds none.
func readPID(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		return -1
	}
	return pid
}

// fileTail returns the last 4,000 bytes of the file at path, for failure messages.
func fileTail(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return b, err
}

// hasFiles tells whether dir holds every one of names as a file.
func hasFiles(dir string, names ...string) bool {
	for _, f := range names {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.IsDir() {
			return false
		}
	}
	return true
}

// alive tells whether process pid exists and is not a zombie.
func alive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	defer func() { _ = p.Release() }()
	if err := p.Signal(syscall.Signal(0)); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	if stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
		if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
			return false
		}
	}
	return true
}

func procFS() bool {
	_, err := os.Stat("/proc/self/cmdline")
	return err == nil
}

// cmdlineHas tells whether an argument of process pid is dir.
func cmdlineHas(pid int, dir string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	for _, arg := range bytes.Split(b, []byte{0}) {
		if string(arg) == dir {
			return true
		}
	}
	return false
}

// procsWith returns the live processes with dir as an argument.
func procsWith(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if cmdlineHas(pid, dir) && alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}
