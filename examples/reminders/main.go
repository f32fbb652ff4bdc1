// Command reminders shows cancellable scheduled messages (`go run ./examples/reminders`): it
// schedules three reminders due in 3 s and one a year ahead, lists them from the ledger,
// cancels one of the soon ones and the one a year ahead, and consumes: the two others
// arrive, the cancelled one never does, and nothing is left scheduled.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/ledger"
	"github.com/warrenmq/warren/router"
)

const queue = "warren.example.reminders"

func main() {
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), "Usage: go run ./examples/reminders\n\n"+
			"Schedule reminders (three in 3s, one a year ahead), list them, cancel two, and show that the\n"+
			"cancelled ones never arrive.\n"+
			"The broker is $WARREN_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/).\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if err := run(url); err != nil {
		fmt.Fprintln(os.Stderr, "reminders:", err)
		os.Exit(1)
	}
}

func run(url string) error {
	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Printf("%+7.3fs  "+format+"\n", append([]any{time.Since(start).Seconds()}, args...)...)
	}
	conn := warren.Connection{URL: url}
	pub, err := dlx.NewPublisher(dlx.Config{Connection: conn}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer pub.Close()
	l, err := ledger.New(ledger.Config{Connection: conn, Delay: pub.Delay()}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer l.Close()
	ctx := context.Background()

	run := time.Now().Format("150405") // ids of this run's own
	soon := []string{"tea-" + run, "call-mum-" + run, "stretch-" + run}
	for _, id := range soon {
		if err := schedule(pub, id, 3*time.Second); err != nil {
			return err
		}
	}
	yearly := "renew-passport-" + run
	if err := schedule(pub, yearly, 365*24*time.Hour); err != nil {
		return err
	}
	say("scheduled %s, %s, %s in 3s and %s in a year", soon[0], soon[1], soon[2], yearly)

	entries, err := l.List(ctx, ledger.Filter{Destination: queue})
	if err != nil {
		return err
	}
	for _, e := range entries {
		say("listed    %-24s to %s, due %s", e.ID, e.Destination(), e.Due.Local().Format("2006-01-02 15:04:05"))
	}
	for _, id := range []string{soon[1], yearly} {
		if err := l.Cancel(ctx, id); err != nil {
			return err
		}
		say("cancelled %s", id)
	}

	r, err := router.New(router.Config{Connection: conn}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
		both = make(chan struct{})
	)
	err = r.AddConsumerHandler(router.HandlerConfig{Queue: queue, Middleware: []message.HandlerMiddleware{l.Middleware}},
		func(msg *message.Message) error {
			say("arrived   %s", msg.UUID)
			mu.Lock()
			defer mu.Unlock()
			seen[msg.UUID] = true
			if seen[soon[0]] && seen[soon[2]] {
				select {
				case <-both:
				default:
					close(both)
				}
			}
			return nil
		})
	if err != nil {
		return err
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	select {
	case <-both:
	case <-time.After(30 * time.Second):
		stop()
		return errors.New("the reminders did not arrive")
	}
	time.Sleep(time.Second) // the cancelled one, due with them, would have arrived by now
	stop()
	if err := <-done; err != nil {
		return err
	}
	mu.Lock()
	if seen[soon[1]] {
		mu.Unlock()
		return fmt.Errorf("the cancelled %s arrived", soon[1])
	}
	mu.Unlock()
	say("%s never arrived: cancelled", soon[1])
	if err := l.Cancel(ctx, soon[0]); errors.Is(err, ledger.ErrDelivered) {
		say("cancel %s now: %v", soon[0], err)
	}
	entries, err = l.List(ctx, ledger.Filter{Destination: queue})
	if err != nil {
		return err
	}
	say("%d reminders left scheduled", len(entries))
	return nil
}

// schedule publishes a reminder under id to the queue, due after d.
func schedule(pub *dlx.Publisher, id string, d time.Duration) error {
	msg := message.NewMessage(id, []byte("remember: "+id))
	warren.Delay(msg, d)
	warren.Schedule(msg, id)
	return pub.Publish(queue, msg)
}
