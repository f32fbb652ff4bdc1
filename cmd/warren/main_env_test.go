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
// the other packages: what a command prints must not depend on it. A test that wants the
// management API passes --management.
func TestMain(m *testing.M) {
	managementURL = testenv.ManagementURL()
	_ = os.Unsetenv("WARREN_MANAGEMENT_URL")
	os.Exit(m.Run())
}
