package main

import (
	neturl "net/url"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren/internal/amqpurl"
	"github.com/warrenmq/warren/internal/testenv"
)

// A wrong password fails the first attempt (exit 1) with the broker's reason and the node,
// whatever --connect-timeout and --timeout allow.
func TestWrongPasswordFailsAtOnce(t *testing.T) {
	t.Parallel()
	testenv.NeedsBroker(t)
	u, err := neturl.Parse(testenv.URL())
	require.NoError(t, err)
	u.User = neturl.UserPassword(u.User.Username(), "not-the-password")
	proxy, url := testenv.ProxyURL(t, u.String())
	for _, args := range [][]string{{"status", "q"}, {"delays", "verify"}, {"kill", "q"}} {
		before := proxy.Accepted()
		_, stderr, code := runCode(t, url, append(args, "--connect-timeout", "1m", "--timeout", "1m")...)
		assert.Equal(t, 1, code, "%v: %s", args, stderr)
		assert.Contains(t, stderr, amqpurl.Redact(url)+`: Exception (403) Reason: "username or password not allowed" (refused: not retried)`, "%v", args)
		assert.NotContains(t, stderr, "retrying", "%v", args)
		assert.NotContains(t, stderr, "not-the-password", "%v", args)
		assert.Equal(t, 1, proxy.Accepted()-before, "%v dialled once: %s", args, stderr)
	}
}

// A node that is down is retried until --connect-timeout, not --timeout, and the error names
// the node and why it failed.
func TestConnectTimeoutNamesTheNode(t *testing.T) {
	t.Parallel()
	testenv.Slow(t)
	url := "amqp://guest:guest@" + testenv.ClosedPort(t) + "/"
	for _, args := range [][]string{{"status", "q"}, {"delays", "verify"}, {"kill", "q"}} {
		_, stderr, code := runCode(t, url, append(args, "--connect-timeout", "500ms", "--timeout", "1m")...)
		assert.Equal(t, 1, code, "%v: %s", args, stderr)
		// The last attempt may be cut short by the deadline ("i/o timeout (before that: ...)").
		assert.Contains(t, stderr, "connect: gave up after 500ms: "+amqpurl.Redact(url)+": dial tcp "+hostOf(url)+": ", "%v", args)
		assert.Contains(t, stderr, amqpurl.Redact(url)+": dial tcp "+hostOf(url)+": connect: connection refused", "%v", args)
	}
}
