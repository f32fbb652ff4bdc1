package router_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// TestMain runs a consumer process for the multi-process tests when the test binary is
// started as one (WARREN_TEST_CHILD=consumers); otherwise it runs the tests.
func TestMain(m *testing.M) {
	if os.Getenv("WARREN_TEST_CHILD") == "consumers" {
		os.Exit(consumerProcess())
	}
	testenv.SkipExamplesIfShort()
	os.Exit(m.Run())
}

// consumerProcess runs $CONSUMERS handlers on $QUEUE until SIGTERM, and writes one line per
// processed message ("processed <uuid>") and per kill event ("event <handler> <state>
// <unix nanoseconds>") to stdout.
func consumerProcess() int {
	n, _ := strconv.Atoi(os.Getenv("CONSUMERS"))
	queue := os.Getenv("QUEUE")
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	line := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(out, format+"\n", args...)
		_ = out.Flush()
	}
	r, err := router.New(router.Config{
		Connection: warren.Connection{URL: os.Getenv("URL")},
		KillSecret: []byte(os.Getenv("SECRET")), OnKill: func(e router.KillEvent) {
			line("event %s %s %d", e.Handler, e.State, e.At.UnixNano())
		},
		Topology: topology.Config{Delay: topology.Delay{Prefix: os.Getenv("DELAY_PREFIX"), Radix: testenv.DelayRadix, Levels: testenv.DelayLevels}},
	}, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for i := range n {
		err := r.AddConsumerHandler(router.HandlerConfig{Name: fmt.Sprintf("%d/c%d", os.Getpid(), i), Queue: queue, Concurrency: 4},
			func(msg *message.Message) error {
				time.Sleep(time.Millisecond) // simulates work
				line("processed %s", msg.UUID)
				return nil
			})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-r.Running()
		line("ready")
	}()
	if err := r.Run(ctx); err != nil && !strings.Contains(err.Error(), "context canceled") {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}
