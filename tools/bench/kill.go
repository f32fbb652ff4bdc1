package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// benchKill measures, over *killRuns kills, the time from calling Killer.Kill (which dials,
// writes the kill state queue and publishes the command) until the last of *killProcs × 4
// consumers, in processes of their own and busy with a stream of messages, has stopped
// (nothing in flight).
func benchKill() {
	const consumers = 4
	fmt.Printf("== kill: %d processes × %d consumers, messages flowing, %d kills (each followed by a resume)\n",
		*killProcs, consumers, *killRuns)
	queue := name("kill")
	delay := config(topology.Delay{Prefix: name("delay")}).Delay
	defer cleanupDelay(delay)
	defer cleanup(testenv.WorkQueueNames(queue))

	self, err := os.Executable()
	must(err)
	var (
		mu     sync.Mutex
		events = map[string][]time.Time{} // state → times
		ready  int
		procs  []*exec.Cmd
		wg     sync.WaitGroup
	)
	for range *killProcs {
		// The URL goes in the environment, not on the command line, where ps shows its password.
		cmd := exec.Command(self, "-kill-child", "-queue-type", *qtype)
		cmd.Env = append(os.Environ(), "WARREN_AMQP_URL="+*url, "QUEUE="+queue, "DELAY_PREFIX="+delay.Prefix, "CONSUMERS="+strconv.Itoa(consumers))
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		must(err)
		must(cmd.Start())
		procs = append(procs, cmd)
		wg.Go(func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				mu.Lock()
				switch {
				case len(f) == 1 && f[0] == "ready":
					ready++
				case len(f) == 2:
					ns, _ := strconv.ParseInt(f[1], 10, 64)
					events[f[0]] = append(events[f[0]], time.Unix(0, ns))
				}
				mu.Unlock()
			}
		})
	}
	defer func() {
		for _, p := range procs {
			_ = p.Process.Signal(syscall.SIGTERM)
			_ = p.Wait()
		}
		wg.Wait()
	}()
	since := func(state string, t time.Time) []time.Time {
		mu.Lock()
		defer mu.Unlock()
		var ts []time.Time
		for _, e := range events[state] {
			if !e.Before(t) {
				ts = append(ts, e)
			}
		}
		return ts
	}
	await := func(cond func() bool) {
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				must(fmt.Errorf("kill: consumers did not react within 30s"))
			}
		}
	}
	await(func() bool { mu.Lock(); defer mu.Unlock(); return ready == *killProcs })

	pub, err := dlx.NewPublisher(dlx.Config{Connection: warren.Connection{URL: *url}, Topology: config(delay)}, nil)
	must(err)
	defer pub.Close()
	stop := make(chan struct{})
	var pwg sync.WaitGroup
	pwg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				_ = pub.Publish(queue, message.NewMessage(watermill.NewUUID(), nil))
			}
		}
	})
	defer func() { close(stop); pwg.Wait() }()

	killer, err := kill.NewKiller(kill.Config{Connection: warren.Connection{URL: *url}}, nil)
	must(err)
	n := *killProcs * consumers
	var lat []float64
	for range *killRuns {
		time.Sleep(200 * time.Millisecond) // messages flow
		sent := time.Now()
		must(killer.Kill(context.Background(), queue, kill.Stop))
		await(func() bool { return len(since("stopped", sent)) >= n })
		last := sent
		for _, t := range since("stopped", sent) {
			if t.After(last) {
				last = t
			}
		}
		lat = append(lat, float64(last.Sub(sent))/float64(time.Millisecond))
		resumed := time.Now()
		must(killer.Resume(context.Background(), queue))
		await(func() bool { return len(since("resumed", resumed)) >= n })
	}
	sort.Float64s(lat)
	fmt.Printf("   until the last consumer stopped: p50 %.1f ms, max %.1f ms (min %.1f ms)\n",
		percentile(lat, 0.5), lat[len(lat)-1], lat[0])
	result("kill_p50_ms", "%.1f", percentile(lat, 0.5))
	result("kill_max_ms", "%.1f", lat[len(lat)-1])
}

// killChild runs $CONSUMERS consumers of $QUEUE until SIGTERM; it prints "ready" and, for
// each kill event, "<state> <unix ns>".
func killChild() {
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	r, err := router.New(router.Config{
		Connection: warren.Connection{URL: *url},
		OnKill:     func(e router.KillEvent) { say("%s %d", e.State, e.At.UnixNano()) },
		Topology:   config(topology.Delay{Prefix: os.Getenv("DELAY_PREFIX")}),
	}, nil)
	must(err)
	n, _ := strconv.Atoi(os.Getenv("CONSUMERS"))
	for i := range n {
		must(r.AddConsumerHandler(router.HandlerConfig{Name: fmt.Sprintf("c%d", i), Queue: os.Getenv("QUEUE"), Concurrency: 4},
			func(*message.Message) error { time.Sleep(time.Millisecond); return nil }))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	go func() { <-r.Running(); say("ready") }()
	must(r.Run(ctx))
}
