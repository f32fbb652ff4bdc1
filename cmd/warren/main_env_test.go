package main

import (
	"os"
	"testing"

	"github.com/warrenmq/warren/internal/testenv"
)

// managementURL is the management API of the broker the tests use, as the run was given it
// (testenv.ManagementURL), for a test that passes it with --management.
var managementURL string

// TestMain runs the tests without $WARREN_MANAGEMENT_URL, which `make test-rabbitmq4` sets for
// the other packages, nor $WARREN_POSTGRES_URL, which a developer may set for the tests of
// outbox: what a command prints must not depend on them. A test that wants the management
// API passes --management; one that wants the outbox, --postgres testenv.PostgresURL() (read
// before the variable was unset).
func TestMain(m *testing.M) {
	managementURL = testenv.ManagementURL()
	_ = os.Unsetenv("WARREN_MANAGEMENT_URL")
	_ = os.Unsetenv("WARREN_POSTGRES_URL")
	os.Exit(m.Run())
}

// cliArgs is warren's command line against url with args: --connect-timeout and --timeout
// derive from testenv.Patience, so that a loaded broker's slow declare or answer does not
// end a command that a test expects to succeed. A test that wants other limits passes them
// in args: the last of a flag wins.
func cliArgs(url string, args ...string) []string {
	p := testenv.Patience()
	return append([]string{"--url", url, "--connect-timeout", p.String(), "--timeout", (2 * p).String()}, args...)
}
