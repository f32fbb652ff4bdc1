package outbox_test

import (
	"os"
	"testing"

	"github.com/warrenmq/warren/internal/testenv"
)

// TestMain skips the Examples under -short: they talk to the broker and PostgreSQL.
func TestMain(m *testing.M) {
	testenv.SkipExamplesIfShort()
	os.Exit(m.Run())
}
