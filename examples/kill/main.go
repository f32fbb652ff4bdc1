// Command kill shows warren's kill topic (`go run ./examples/kill`): it starts 3 worker
// processes with 4 consumers each on one queue, publishes to it, sends one kill and prints
// every consumer stopping; a worker started after the kill stays stopped; a resume starts
// them all again; a kill with delete drains the queue and deletes it.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/router"
)

const queue = "warren.example.kill"

func main() {
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), "Usage: go run ./examples/kill\n\n"+
			"Start 3 worker processes with 4 consumers each on one queue; kill, resume and delete it, printing\n"+
			"how the consumers answer.\n"+
			"The broker is $WARREN_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/).\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	run := demo
	if os.Getenv("WARREN_EXAMPLE_WORKER") != "" {
		run = worker
	}
	if err := run(url); err != nil {
		fmt.Fprintln(os.Stderr, "kill:", err)
		os.Exit(1)
	}
}

// worker runs 4 consumers until SIGTERM and prints what they do about the kill topic.
func worker(url string) error {
	r, err := router.New(router.Config{
		Connection: warren.Connection{URL: url},
		OnKill: func(e router.KillEvent) {
			fmt.Printf("%s %s %d\n", e.Handler, e.State, e.At.UnixNano())
		},
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	for i := range 4 {
		name := fmt.Sprintf("pid %d consumer %d", os.Getpid(), i)
		name = strings.ReplaceAll(name, " ", "_")
		if err := r.AddConsumerHandler(router.HandlerConfig{Name: name, Queue: queue, Concurrency: 4}, func(*message.Message) error {
			time.Sleep(2 * time.Millisecond) // some work
			fmt.Println("processed")
			return nil
		}); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	go func() { <-r.Running(); fmt.Println("ready") }()
	return r.Run(ctx)
}

type demoState struct {
	mu        sync.Mutex
	start     time.Time
	processed int
	states    map[string]string // consumer → last state
	lastStop  time.Time         // of the latest "stopped" event
	ready     int
}

func (d *demoState) say(format string, args ...any) {
	fmt.Printf("%+8.3fs  "+format+"\n", append([]any{time.Since(d.start).Seconds()}, args...)...)
}

// count returns how many consumers are in state.
func (d *demoState) count(state string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, s := range d.states {
		if s == state {
			n++
		}
	}
	return n
}

func (d *demoState) wait(cond func() bool) {
	for deadline := time.Now().Add(30 * time.Second); !cond() && time.Now().Before(deadline); {
		time.Sleep(2 * time.Millisecond)
	}
}

func demo(url string) error {
	d := &demoState{start: time.Now(), states: map[string]string{}}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var workers []*exec.Cmd
	startWorkers := func(n int) {
		for range n {
			cmd := exec.Command(self)
			cmd.Env = append(os.Environ(), "WARREN_EXAMPLE_WORKER=1")
			out, _ := cmd.StdoutPipe()
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				d.say("cannot start a worker: %v", err)
				continue
			}
			workers = append(workers, cmd)
			go d.relay(out)
		}
	}
	defer func() {
		for _, w := range workers {
			_ = w.Process.Signal(syscall.SIGTERM)
			_ = w.Wait()
		}
	}()

	pub, err := dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: url}}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer pub.Close()
	// Force: at the clean start below, the queue may not exist yet.
	killer, err := kill.NewKiller(kill.Config{Connection: warren.Connection{URL: url}, Force: true}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	// A clean start (nobody listens yet: the resume is remembered for the workers).
	if err := killer.Resume(context.Background(), queue); err != nil && !errors.Is(err, kill.ErrNoListener) {
		return err
	}

	startWorkers(3)
	d.wait(func() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.ready == 3 })
	d.say("3 worker processes × 4 consumers on %s; publishing", queue)
	stopPublishing := make(chan struct{})
	published := make(chan int)
	go func() {
		n := 0
		for {
			select {
			case <-stopPublishing:
				published <- n
				return
			default:
			}
			if pub.Publish(queue, message.NewMessage(watermill.NewUUID(), nil)) == nil {
				n++
			}
		}
	}()
	time.Sleep(time.Second)

	d.mu.Lock()
	d.say("%d messages processed; sending one kill", d.processed)
	d.mu.Unlock()
	sent := time.Now()
	if err := killer.Kill(context.Background(), queue, kill.Stop); err != nil {
		return err
	}
	d.wait(func() bool { return d.count("stopped") == 12 })
	d.mu.Lock()
	d.say("all 12 consumers stopped, the last %s after the kill was sent", d.lastStop.Sub(sent).Round(100*time.Microsecond))
	d.mu.Unlock()

	close(stopPublishing)
	n := <-published
	d.mu.Lock()
	done := d.processed
	d.mu.Unlock()
	d.say("published %d, processed %d; the other %d wait in the queue", n, done, n-done)

	startWorkers(1)
	// Until its 4 consumers have read the kill (they take turns reading the kill state: on a
	// busy machine the last may take over a second after the process starts).
	d.wait(func() bool { return d.count("stopped") == 16 })
	d.mu.Lock()
	since := d.processed - done
	d.mu.Unlock()
	d.say("a 4th worker started after the kill: %d of its consumers stopped at once; processed since: %d", d.count("stopped")-12, since)

	if err := killer.Resume(context.Background(), queue); err != nil {
		return err
	}
	d.wait(func() bool { return d.count("resumed") == 16 })
	d.wait(func() bool { d.mu.Lock(); defer d.mu.Unlock(); return d.processed >= n })
	d.say("resume: 16 consumers consume again; all %d messages processed", n)

	if err := killer.Kill(context.Background(), queue, kill.Delete); err != nil {
		return err
	}
	d.wait(func() bool { return d.count("deleted") == 16 })
	d.say("kill --delete: the consumers drained %s and deleted it; all 16 ended", queue)
	return nil
}

// relay reads a worker's output.
func (d *demoState) relay(out interface{ Read([]byte) (int, error) }) {
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		d.mu.Lock()
		switch {
		case len(f) == 1 && f[0] == "processed":
			d.processed++
		case len(f) == 1 && f[0] == "ready":
			d.ready++
		case len(f) == 3:
			d.states[f[0]] = f[1]
			if f[1] == "stopped" {
				var ns int64
				if _, err := fmt.Sscan(f[2], &ns); err != nil {
					continue
				}
				if t := time.Unix(0, ns); t.After(d.lastStop) {
					d.lastStop = t
				}
			}
			if f[1] == "stopped" || f[1] == "deleted" {
				d.say("%-26s %s", strings.ReplaceAll(f[0], "_", " "), f[1])
			}
		}
		d.mu.Unlock()
	}
}
