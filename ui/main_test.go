package ui_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/warrenmq/warren/internal/testenv"
)

// TestMain skips the Examples under -short (they talk to the broker) and checks that no
// test leaves a goroutine behind.
func TestMain(m *testing.M) {
	testenv.SkipExamplesIfShort()
	goleak.VerifyTestMain(m)
}
