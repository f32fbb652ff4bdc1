package main

import (
	"os"
	"testing"
)

// TestMain runs the tests without $WARREN_MANAGEMENT_URL, which `make test-rabbitmq4` sets for
// the other packages: what a command prints must not depend on it. A test that wants the
// management API passes --management.
func TestMain(m *testing.M) {
	_ = os.Unsetenv("WARREN_MANAGEMENT_URL")
	os.Exit(m.Run())
}
