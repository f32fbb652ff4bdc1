package rpc_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/warrenmq/warren/internal/testenv"
)

// TestMain skips the Examples under -short (they talk to the broker) and fails on goroutines
// left running after the tests: every Client and router is closed by then.
func TestMain(m *testing.M) {
	testenv.SkipExamplesIfShort()
	goleak.VerifyTestMain(m)
}
