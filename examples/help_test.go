package examples

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warrenmq/warren/internal/testenv"
)

// Every demo honours -h: it prints its usage and exits 0 without touching the broker (here a
// closed port) or Redis.
func TestDemosHelp(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	_ = l.Close()

	dirs, err := filepath.Glob("*/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 9 {
		t.Fatalf("found %d demos: %v", len(dirs), dirs)
	}
	for _, main := range dirs {
		dir := filepath.Dir(main)
		t.Run(dir, func(t *testing.T) {
			t.Parallel()
			bin := build(t, dir)
			ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience())
			defer cancel()
			cmd := exec.CommandContext(ctx, bin, "-h")
			cmd.Env = append(os.Environ(), "WARREN_AMQP_URL=amqp://guest:guest@"+closed+"/", "WARREN_REDIS_ADDR="+closed)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s -h: %v\n%s", dir, err, out)
			}
			if !strings.HasPrefix(string(out), "Usage: go run ./examples/"+dir) {
				t.Errorf("%s -h printed no usage line:\n%s", dir, out)
			}
		})
	}
}
