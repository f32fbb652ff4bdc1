package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// PGServer is a PostgreSQL server of a test's own: a cluster made by initdb in a directory of
// its own, run by pg_ctl on a free port of 127.0.0.1 (never the shared server's 5432) with its
// unix socket in that directory and trust authentication, stopped and removed when the test
// ends. Stopping and starting it (Stop, Start, Restart) never disturbs the shared server.
//
// Its settings are initdb's defaults (fsync and synchronous_commit on: a row whose COMMIT
// returned survives an immediate stop). When the test runs as root, which initdb refuses,
// initdb, pg_ctl and the server run as the user "postgres" (else "nobody"), who owns the
// directory. Its methods fail the test, so call them from the test's goroutine.
type PGServer struct {
	t    testing.TB
	bin  string // directory of initdb, pg_ctl and postgres
	dir  string // the server's: data/, its log, its socket, the owner file
	port int
	cred *syscall.Credential // nil: run as the test's user

	mu      sync.Mutex
	running bool
	removed bool
}

// PGStopMode is how PGServer.Stop shuts the server down: pg_ctl stop's -m.
type PGStopMode string

// The modes of PGServer.Stop.
const (
	// PGFast rolls back every open transaction, closes the connections and writes a
	// checkpoint before the server exits (pg_ctl stop -m fast, SIGINT).
	PGFast PGStopMode = "fast"
	// PGImmediate makes every process of the server quit at once, without a checkpoint
	// (pg_ctl stop -m immediate, SIGQUIT): PostgreSQL's kill -9; the next start replays
	// the write-ahead log.
	PGImmediate PGStopMode = "immediate"
)

// PGBinEnv names the environment variable that, when set, is the directory of the initdb,
// pg_ctl and postgres that StartPostgres runs; otherwise the newest /usr/lib/postgresql/*/bin
// that holds them, else the ones in PATH.
const PGBinEnv = "WARREN_POSTGRES_BIN"

const pgDirPrefix = "warren-pg-"

// The limits of initdb, pg_ctl start and pg_ctl stop, from Patience.
var (
	pgInitLimit  = 2 * Patience()
	pgStartLimit = 2 * Patience()
	pgStopLimit  = Patience()
)

// StartPostgres makes a fresh PostgreSQL cluster and starts it (failing the test if it
// cannot), and stops it and removes its files when t ends.
//
// Its directory is made with os.MkdirTemp rather than t.TempDir: the server's user must reach
// it, and t.TempDir's parent directory is private to the test's user. A directory left by a
// test process that was killed is swept, with its server, by the next StartPostgres.
func StartPostgres(t testing.TB) *PGServer {
	t.Helper()
	NeedsBroker(t)
	bin, err := postgresBin()
	if err != nil {
		t.Fatalf("testenv.StartPostgres needs a local PostgreSQL installation (initdb, pg_ctl and "+
			"postgres; e.g. `apt-get install postgresql`, or $%s): %v", PGBinEnv, err)
	}
	cred, err := postgresCredential()
	if err != nil {
		t.Fatalf("testenv.StartPostgres: %v", err)
	}
	sweepStalePostgres(bin, cred)
	dir, err := os.MkdirTemp("", pgDirPrefix)
	if err != nil {
		t.Fatalf("postgres: %v", err)
	}
	s := &PGServer{t: t, bin: bin, dir: dir, cred: cred}
	// The server is stopped before its directory goes, also when starting fails.
	t.Cleanup(s.remove)
	if err := os.WriteFile(filepath.Join(dir, "owner"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		t.Fatalf("postgres: %v", err)
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatalf("postgres: %v", err)
		}
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatalf("postgres: %v", err)
	}
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), pgInitLimit)
	defer cancel()
	// --no-sync: initdb's files are not flushed to disk at its end, which only a crash of the
	// machine would notice; the server itself runs with fsync on.
	if out, err := s.run(ctx, "initdb", "-D", s.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8",
		"--no-locale", "--no-sync"); err != nil {
		t.Fatalf("postgres: initdb: %v\n%s", err, out)
	}
	for attempt := 1; ; attempt++ {
		if s.port, err = pgPort(); err != nil {
			t.Fatalf("postgres: %v", err)
		}
		conf := fmt.Sprintf("\n# testenv.StartPostgres\nlisten_addresses = '127.0.0.1'\nport = %d\n"+
			"unix_socket_directories = '%s'\nmax_connections = 100\n", s.port, dir)
		if err := appendFile(filepath.Join(s.data(), "postgresql.conf"), conf); err != nil {
			t.Fatalf("postgres: %v", err)
		}
		err := s.start()
		if err == nil {
			break
		}
		// A port taken between choosing it and the server binding it: try another one.
		if attempt < 3 && strings.Contains(s.LogTail(), "could not bind") {
			t.Logf("postgres: port %d taken, retrying with another one", s.port)
			continue // the last port setting in postgresql.conf wins
		}
		t.Fatalf("postgres: %v\n%s", err, s.LogTail())
	}
	t.Logf("PostgreSQL %s on port %d started in %v", filepath.Base(filepath.Dir(bin)), s.port,
		time.Since(begin).Round(time.Millisecond))
	return s
}

// URL is the server's URL, for its superuser postgres and database postgres (trust: no
// password).
func (s *PGServer) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// Port is the server's TCP port on 127.0.0.1.
func (s *PGServer) Port() int { return s.port }

// Dir is the server's directory: data/ (the cluster), postgres.log, the unix socket.
func (s *PGServer) Dir() string { return s.dir }

// Stop shuts the server down in mode and returns once every process of it has exited; the
// server stays down until Start. It fails the test on error.
func (s *PGServer) Stop(mode PGStopMode) {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running {
		s.t.Fatalf("postgres on port %d: Stop while stopped", s.port)
	}
	if err := s.stop(mode); err != nil {
		s.t.Fatalf("postgres on port %d: %v\n%s", s.port, err, s.LogTail())
	}
}

// Start starts the server that Stop left down, on the same port and data, and returns once
// it accepts connections (after replaying the write-ahead log, following an immediate stop).
// It fails the test on error.
func (s *PGServer) Start() {
	s.t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running || s.removed {
		s.t.Fatalf("postgres on port %d: Start while running or removed", s.port)
	}
	if err := s.start(); err != nil {
		s.t.Fatalf("postgres on port %d: %v\n%s", s.port, err, s.LogTail())
	}
}

// Restart stops the server in mode and starts it again; it returns once the server accepts
// connections, and fails the test on error.
func (s *PGServer) Restart(mode PGStopMode) {
	s.t.Helper()
	s.Stop(mode)
	s.Start()
}

// LogTail returns the end of the server's log, for failure messages.
func (s *PGServer) LogTail() string {
	b, err := fileTail(filepath.Join(s.dir, "postgres.log"))
	if err != nil {
		return ""
	}
	return "--- postgres.log:\n" + string(b)
}

func (s *PGServer) data() string { return filepath.Join(s.dir, "data") }

// start runs pg_ctl start, which waits until the server accepts connections. The caller
// holds s.mu, or s is not yet shared.
func (s *PGServer) start() error {
	ctx, cancel := context.WithTimeout(context.Background(), pgStartLimit)
	defer cancel()
	out, err := s.run(ctx, "pg_ctl", "start", "-w", "-t", strconv.Itoa(int(pgStartLimit.Seconds())),
		"-D", s.data(), "-l", filepath.Join(s.dir, "postgres.log"))
	if err != nil {
		// pg_ctl may give up while the server still starts: it must not outlive the test.
		_ = s.stop(PGImmediate)
		return fmt.Errorf("pg_ctl start: %w\n%s", err, out)
	}
	s.running = true
	return nil
}

// stop runs pg_ctl stop -m mode, which waits until the postmaster has removed its pid file,
// gives the postmaster a moment to exit after that, and kills it if it is still there. The
// caller holds s.mu.
func (s *PGServer) stop(mode PGStopMode) error {
	s.running = false
	pid := postmasterPID(s.data())
	ctx, cancel := context.WithTimeout(context.Background(), pgStopLimit)
	defer cancel()
	out, err := s.run(ctx, "pg_ctl", "stop", "-w", "-t", strconv.Itoa(int(pgStopLimit.Seconds())),
		"-m", string(mode), "-D", s.data())
	there := func() bool { return pid > 0 && alive(pid) && (!procFS() || cmdlineHas(pid, s.data())) }
	// The postmaster removes its pid file, which pg_ctl waits for, and then exits.
	for deadline := time.Now().Add(2 * time.Second); err == nil && there() && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if there() {
		if err == nil {
			err = errors.New("the postmaster is still there")
		}
		_ = syscall.Kill(pid, syscall.SIGKILL)
		for deadline := time.Now().Add(5 * time.Second); alive(pid) && time.Now().Before(deadline); {
			time.Sleep(50 * time.Millisecond) // not our child: no exit to wait on
		}
	}
	if err != nil && pid > 0 {
		return fmt.Errorf("pg_ctl stop -m %s: %w\n%s", mode, err, out)
	}
	return nil
}

// remove stops the server, if it runs, and removes its directory: at the end of the test.
func (s *PGServer) remove() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.removed {
		return
	}
	s.removed = true
	if s.running || postmasterPID(s.data()) > 0 {
		if err := s.stop(PGImmediate); err != nil {
			s.t.Errorf("postgres on port %d: %v", s.port, err)
		}
	}
	if err := os.RemoveAll(s.dir); err != nil {
		s.t.Errorf("postgres: remove %s: %v", s.dir, err)
	}
}

// run runs one of the server's programs as the server's user, and returns its combined
// output.
func (s *PGServer) run(ctx context.Context, program string, args ...string) (string, error) {
	return pgRun(ctx, s.bin, s.cred, s.dir, program, args...)
}

// pgRun runs bin/program as cred's user (nil: the test's), in dir, without the PG*
// variables of the test's environment.
func pgRun(ctx context.Context, bin string, cred *syscall.Credential, dir, program string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(bin, program), args...)
	cmd.Dir = dir
	cmd.Env = []string{"HOME=" + dir, "PATH=" + bin + ":/usr/bin:/bin", "LC_ALL=C"}
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	return out.String(), err
}

// postmasterPID returns the pid in data's postmaster.pid, 0 (or less) if none.
func postmasterPID(data string) int { return readPID(filepath.Join(data, "postmaster.pid")) }

// pgPort returns a port free on 127.0.0.1 just now, never 5432.
func pgPort() (int, error) {
	for {
		ports, err := freePorts(1)
		if err != nil {
			return 0, err
		}
		if ports[0] != 5432 {
			return ports[0], nil
		}
	}
}

// postgresBin finds the directory of initdb, pg_ctl and postgres: $PGBinEnv, else the newest
// /usr/lib/postgresql/<version>/bin that holds them (Debian's layout; initdb is not in PATH
// there), else the directory of the initdb in PATH.
func postgresBin() (string, error) {
	ok := func(dir string) bool { return hasFiles(dir, "initdb", "pg_ctl", "postgres") }
	if dir := os.Getenv(PGBinEnv); dir != "" {
		if !ok(dir) {
			return "", fmt.Errorf("$%s=%s holds no initdb, pg_ctl and postgres", PGBinEnv, dir)
		}
		return dir, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	version := func(dir string) int {
		v, _ := strconv.Atoi(filepath.Base(filepath.Dir(dir)))
		return v
	}
	slices.SortFunc(dirs, func(a, b string) int { return version(b) - version(a) })
	for _, dir := range dirs {
		if ok(dir) {
			return dir, nil
		}
	}
	p, err := exec.LookPath("initdb")
	if err != nil {
		return "", errors.New("no /usr/lib/postgresql/*/bin holds initdb, pg_ctl and postgres, and no initdb in PATH")
	}
	if dir := filepath.Dir(p); ok(dir) {
		return dir, nil
	}
	return "", fmt.Errorf("no pg_ctl and postgres next to %s", p)
}

// postgresCredential returns the user the server runs as: nil (the test's own) unless the
// test runs as root, which initdb and postgres refuse; then "postgres", else "nobody".
func postgresCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, errors.New("the tests run as root, which PostgreSQL refuses, and there is no user postgres or nobody to run it as")
}

// sweepStalePostgres stops the servers, and removes the directories, left by test processes
// that ended without cleaning up (killed, or timed out).
func sweepStalePostgres(bin string, cred *syscall.Credential) {
	for _, dir := range staleDirs(pgDirPrefix) {
		data := filepath.Join(dir, "data")
		if pid := postmasterPID(data); pid > 0 && alive(pid) && (!procFS() || cmdlineHas(pid, data)) {
			ctx, cancel := context.WithTimeout(context.Background(), pgStopLimit)
			_, _ = pgRun(ctx, bin, cred, dir, "pg_ctl", "stop", "-w", "-m", string(PGImmediate), "-D", data)
			cancel()
			if alive(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = os.RemoveAll(dir)
	}
}

// appendFile appends text to the file at path.
func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(text); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}
