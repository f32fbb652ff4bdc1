package testenv

import (
	"math/rand/v2"
	"net"
	"strconv"
	"testing"
	"time"
)

// BlackHole listens on a free local port, accepts every connection and never answers (a
// broker that hangs), until t ends. It returns the host:port.
func BlackHole(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("black hole: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	go hold(l)
	return l.Addr().String()
}

// BlackHoleAfter returns a local host:port that refuses connections (a stopped broker) for
// d, and then accepts them and never answers (a broker that hangs while starting), until t
// ends.
func BlackHoleAfter(t testing.TB, d time.Duration) string {
	t.Helper()
	addr := ClosedPort(t)
	var l net.Listener
	done := make(chan struct{})
	timer := time.AfterFunc(d, func() {
		defer close(done)
		var err error
		if l, err = net.Listen("tcp", addr); err != nil {
			t.Errorf("black hole at %s: %v", addr, err)
			return
		}
		go hold(l)
	})
	t.Cleanup(func() {
		if !timer.Stop() {
			<-done
			if l != nil {
				_ = l.Close()
			}
		}
	})
	return addr
}

// hold accepts connections on l, reads nothing, and closes them once l is closed.
func hold(l net.Listener) {
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		conns = append(conns, c)
	}
}

// ClosedPort returns a local host:port that nothing listens on (a stopped broker). It is
// below the ephemeral ports (32768 and up on Linux, 49152 on others), which the system hands
// to every outgoing connection and every listener on port 0, so that no other test's
// connection takes it before the test uses it; and above the ports of the local brokers
// (5672, 5680 and their management and distribution ports).
func ClosedPort(t testing.TB) string {
	t.Helper()
	const low, high = 26000, 32768
	for range 100 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(low+rand.IntN(high-low)))
		if l, err := net.Listen("tcp", addr); err == nil {
			_ = l.Close()
			return addr
		}
	}
	t.Fatalf("closed port: none free in [%d, %d)", low, high)
	return ""
}

// WithinLimit reports (as a test error) a call that returned outside [0.9·limit,
// 1.5·limit + 500ms]: a time limit kept, neither early nor late. The upper bound leaves room
// for a loaded machine (in make test, a call with a 2 s limit returned after 2.39 s) and
// still tells a limit kept from a call left to the heartbeat's timeout (15 s).
func WithinLimit(t testing.TB, limit, elapsed time.Duration, what string) bool {
	t.Helper()
	lo, hi := limit*9/10, limit*3/2+500*time.Millisecond
	if elapsed < lo || elapsed > hi {
		t.Errorf("%s returned after %s: outside %s..%s (limit %s)", what, elapsed.Round(time.Millisecond), lo, hi, limit)
		return false
	}
	return true
}
