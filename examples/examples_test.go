// Package examples holds only the tests of the demos: TestDemos builds every demo under
// examples/ and runs the ones that end by themselves against the broker ($WARREN_AMQP_URL),
// checking that their output has the lines the docs show (README.md's Demos, and the pages
// of docs/ it links; skipped by go test -short); the others check that every demo honours -h
// and imports no internal/ package.
package examples

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/topology"
)

// built is where every demo is built, once per test binary (one go build for all of them
// takes a third of the time of one per demo), and why that failed.
var built struct {
	once sync.Once
	dir  string
	err  error
}

// TestMain removes the demos' binaries after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// build returns the path of the demo in dir, built with every other demo into a temporary
// directory the first time a test asks for one.
func build(t *testing.T, dir string) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir, built.err = os.MkdirTemp("", "warren-demos-"); built.err != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", built.dir+string(filepath.Separator), "./...").CombinedOutput()
		if err != nil {
			built.err = fmt.Errorf("go build ./examples/...: %w\n%s", err, out)
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return filepath.Join(built.dir, dir)
}

// run runs bin with args until it exits (at most limit), and returns its output; it fails
// the test on a non-zero exit.
func run(t *testing.T, limit time.Duration, bin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	out, err := cmd.CombinedOutput()
	t.Logf("%s %s:\n%s", filepath.Base(bin), strings.Join(args, " "), out)
	if err != nil {
		t.Fatalf("%s %s: %v", filepath.Base(bin), strings.Join(args, " "), err)
	}
	return string(out)
}

// contains fails the test for each of want that out lacks.
func contains(t *testing.T, out string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("the output lacks %q", w)
		}
	}
	if strings.Contains(out, "EARLY") {
		t.Errorf("a message arrived early")
	}
}

func amqpURL() string {
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	first, _, _ := strings.Cut(url, ",")
	return first
}

// deleteQueue deletes a work queue the consumer demo leaves, with its poison queue and kill
// exchange.
func deleteQueue(t *testing.T, queue string) {
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		t.Logf("delete %s: %v", queue, err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Logf("delete %s: %v", queue, err)
		return
	}
	_, _ = ch.QueueDelete(queue, false, false, false)
	_, _ = ch.QueueDelete(topology.PoisonQueue(queue), false, false, false)
	_ = ch.ExchangeDelete(topology.KillExchange(queue), false, false)
}

// The demos are there to be copied: none imports a package under internal/, which no other
// module can import (the packages they import may use internal/ themselves).
func TestDemosImportNoInternalPackage(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "./...")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./examples/...: %v", err)
	}
	demos := 0
	for line := range strings.Lines(strings.TrimSpace(string(out))) {
		fields := strings.Fields(line)
		if fields[0] == "github.com/warrenmq/warren/examples" {
			continue // this test, which copies nothing
		}
		demos++
		for _, imp := range fields[1:] {
			if strings.HasPrefix(imp, "github.com/warrenmq/warren/internal/") {
				t.Errorf("%s imports %s: a copy of it does not compile", fields[0], imp)
			}
		}
	}
	if demos < 9 {
		t.Fatalf("found %d demos:\n%s", demos, out)
	}
}

// TestDemos runs the demos one after the other (several share queue names), each in a few
// seconds; the consumer demo with the publish demo beside it.
func TestDemos(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demos on the broker")
	}
	// A queue of this run's own, so that a demo consumer someone runs is not disturbed.
	queue := fmt.Sprintf("warren.example.demo.test-%d", time.Now().UnixNano())

	t.Run("publish", func(t *testing.T) {
		bin := build(t, "publish")
		out := run(t, testenv.Patience(), bin, "-queue", queue)
		contains(t, out, "publishing 1 message to "+queue+", at once", "published #1", "arrived   #1",
			"not delayed:", "it arrived; deleted "+queue)

		out = run(t, testenv.Patience(), bin, "-queue", queue, "-delay", "1500ms", "-count", "2")
		contains(t, out, "delayed 1.5s", "published #2", "requested 1.5s", "late", "all 2 arrived; deleted "+queue)

		// (5 s ahead: building the connection can take seconds on a loaded machine)
		out = run(t, testenv.Patience(), bin, "-queue", queue, "-at", time.Now().Add(5*time.Second).UTC().Format(time.RFC3339Nano))
		contains(t, out, "scheduled for", "requested at", "late", "it arrived; deleted "+queue)

		out = run(t, testenv.Patience(), bin, "-queue", queue, "-at", "+1s")
		contains(t, out, "scheduled for", "requested at", "late", "it arrived; deleted "+queue)
	})

	t.Run("consumer", func(t *testing.T) {
		consumer, publish := build(t, "consumer"), build(t, "publish")
		defer deleteQueue(t, queue) // if the consumer failed before it deleted it
		ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience())
		defer cancel()
		cmd := exec.CommandContext(ctx, consumer, "-queue", queue, "-count", "2", "-for", "45s", "-delete")
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = cmd.Stdout
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var (
			mu  sync.Mutex
			buf bytes.Buffer
		)
		started, ended := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(ended)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				mu.Lock()
				buf.WriteString(sc.Text() + "\n")
				mu.Unlock()
				if strings.HasPrefix(sc.Text(), "consuming ") {
					close(started)
				}
			}
		}()
		select {
		case <-started:
		case <-ended:
			t.Fatal("the consumer ended before it consumed")
		case <-ctx.Done():
			t.Fatal("the consumer did not start")
		}
		contains(t, run(t, testenv.Patience(), publish, "-queue", queue, "-delay", "1s", "-body", "delayed"),
			"not waiting: "+queue+" has 1 consumer already")
		contains(t, run(t, testenv.Patience(), publish, "-queue", queue, "-body", "at once"),
			"not waiting: "+queue+" has 1 consumer already")
		<-ended
		err = cmd.Wait()
		mu.Lock()
		out := buf.String()
		mu.Unlock()
		t.Logf("consumer:\n%s", out)
		if err != nil {
			t.Fatalf("consumer: %v", err)
		}
		contains(t, out, `body "at once"`, "without a delay: arrived", `body "delayed"`, "waited in the delay levels p",
			"(requested 1s): arrived", "handled 2 messages", "deleted "+queue)
	})

	t.Run("fanout", func(t *testing.T) {
		out := run(t, testenv.Patience(), build(t, "fanout"), "-compact")
		contains(t, out, "billing   got order.created", "shipping  got order.created", `"SpanKind":4`,
			"child of place order", "process warren.example.fanout.billing", "process warren.example.fanout.shipping",
			"one trace: 4 spans share trace id")
	})

	t.Run("delays", func(t *testing.T) {
		out := run(t, testenv.Patience(), build(t, "delays"))
		contains(t, out, "refused   #5 order.eu.created", "arrived   #1 tasks", "arrived   #4 order.created")
	})

	t.Run("retries", func(t *testing.T) {
		out := run(t, testenv.Patience(), build(t, "retries"), "-delays", "100ms,200ms")
		contains(t, out, "attempt 3 fails", "in warren.example.retries.poison, with:", "attempts exhausted")
	})

	t.Run("ordered", func(t *testing.T) {
		out := run(t, testenv.Patience(), build(t, "ordered"))
		contains(t, out, "79 events of 20 orders over 4 lanes", "o-05  lane 2  created paid packed shipped    (paid: failed once, retried)",
			`o-13 held after "permanent: card blocked": created handled, 2 events wait`,
			"o-13  lane 1  created packed shipped         (paid: poisoned, the order held, then released)",
			"orders out of order: 0")
	})

	t.Run("kill", func(t *testing.T) {
		out := run(t, 2*testenv.Patience(), build(t, "kill"))
		contains(t, out, "all 12 consumers stopped", "4 of its consumers stopped at once; processed since: 0",
			"resume: 16 consumers consume again", "all 16 ended")
	})

	t.Run("reminders", func(t *testing.T) {
		out := run(t, testenv.Patience(), build(t, "reminders"))
		contains(t, out, "in a year", "listed    renew-passport-", "cancelled call-mum-", "arrived   tea-", "arrived   stretch-",
			"never arrived: cancelled", "the message was delivered before the cancellation", "0 reminders left scheduled")
	})

	t.Run("outbox", func(t *testing.T) {
		out := run(t, 4*testenv.Patience(), build(t, "outbox"), "-orders", "300")
		contains(t, out, "killed the order service (SIGKILL)", "killed the billing service (SIGKILL)",
			"300 orders placed, 300 charges: 0 orders never charged, 0 charged twice", "every order charged exactly once")
	})

	t.Run("scheduler", func(t *testing.T) {
		out := run(t, 2*testenv.Patience(), build(t, "scheduler"), "-every", "1s", "-ticks", "2")
		contains(t, out, "is active", "(SIGKILL)", "after the kill", "4 ticks, each 1s after the one before: no tick lost, none twice",
			"the tick published ahead came with no scheduler running")
	})

	t.Run("dashboard", func(t *testing.T) {
		out := run(t, 2*testenv.Patience(), build(t, "dashboard"), "-backlog", "300", "-once", "-listen", "127.0.0.1:0")
		contains(t, out, "backlog: 300 messages in the poison queue of warren.example.dashboard.orders",
			"Overview · warren: RabbitMQ", "To look at: warren.example.dashboard.orders: 300 poison messages, no consumer",
			"Read all 300 messages of the poison queue")
	})

	t.Run("metrics", func(t *testing.T) {
		out := run(t, testenv.Patience(), build(t, "metrics"))
		contains(t, out, "warren_messages_poisoned_total")
	})
}
