// Command scheduler shows warren's recurring jobs (`go run ./examples/scheduler`): it starts
// 3 scheduler processes of one group with a job every 2 s, consumes the job's ticks, kills
// the active process (SIGKILL) and shows another one taking over: no tick lost, none twice.
// Once it stops the schedulers, the tick published ahead still comes.
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
	"sync"
	"syscall"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/scheduler"
	"github.com/warrenmq/warren/topology"
)

const (
	queue = "warren.example.scheduler.ticks"
	group = "warren.example"
)

func main() {
	flag.Usage = func() {
		fmt.Fprint(flag.CommandLine.Output(), "Usage: go run ./examples/scheduler [-every 2s] [-ticks 4]\n\n"+
			"Start 3 scheduler processes of one group with a job every 2s; consume its ticks; kill the active\n"+
			"process and show the next one taking over, no tick lost and none twice.\n"+
			"The broker is $WARREN_AMQP_URL (default amqp://guest:guest@127.0.0.1:5672/).\n")
		flag.PrintDefaults()
	}
	every := flag.Duration("every", 2*time.Second, "the job's interval, whole seconds")
	ticks := flag.Int("ticks", 4, "ticks to show before the kill, and after it")
	flag.Parse()
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	var err error
	if os.Getenv("WARREN_EXAMPLE_SCHEDULER") != "" {
		err = worker(url, *every)
	} else {
		err = demo(url, *every, *ticks)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scheduler:", err)
		os.Exit(1)
	}
}

// worker runs a Scheduler of the group until SIGTERM, and says when it becomes active.
func worker(url string, every time.Duration) error {
	s, err := scheduler.New(scheduler.Config{
		Connection: warren.Connection{URL: url},
		Name:       group,
		Jobs:       []scheduler.Job{{Name: "report", Schedule: fmt.Sprintf("@every %s", every), Topic: queue, Payload: []byte("make the report")}},
	}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	defer s.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	go func() {
		for ctx.Err() == nil && !s.Active() {
			time.Sleep(5 * time.Millisecond)
		}
		if s.Active() {
			fmt.Println("active")
		}
	}()
	fmt.Println("ready")
	return s.Run(ctx)
}

type proc struct {
	cmd  *exec.Cmd
	name string
}

func demo(url string, every time.Duration, n int) error {
	start := time.Now()
	say := func(format string, args ...any) {
		fmt.Printf("%+8.3fs  "+format+"\n", append([]any{time.Since(start).Seconds()}, args...)...)
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		return err
	}
	defer conn.Close()
	// A clean start: the ticks and the group state of an earlier run are gone (its ticks
	// would be caught up).
	if err := clean(conn); err != nil {
		return err
	}
	defer func() { _ = clean(conn) }()
	if err := declare(conn); err != nil {
		return err
	}

	self, err := os.Executable()
	if err != nil {
		return err
	}
	var (
		mu     sync.Mutex
		procs  []*proc
		active = make(chan *proc, 8)
	)
	for i := range 3 {
		cmd := exec.Command(self, "-every", every.String())
		cmd.Env = append(os.Environ(), "WARREN_EXAMPLE_SCHEDULER=1")
		out, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		p := &proc{cmd: cmd, name: fmt.Sprintf("process %d (pid %d)", i+1, cmd.Process.Pid)}
		procs = append(procs, p)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if sc.Text() == "active" {
					active <- p
				}
			}
		}()
	}
	stopAll := func() {
		mu.Lock()
		defer mu.Unlock()
		for _, p := range procs {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			_ = p.cmd.Wait()
		}
		procs = nil
	}
	defer stopAll()
	say("3 scheduler processes in group %q, job \"report\" @every %s to %s", group, every, queue)

	first := <-active
	say("%s is active", first.name)
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	if err != nil {
		return err
	}
	var got []time.Time
	seen := map[string]bool{} // tick ids
	copies := 0
	show := func(k int) error {
		for k > 0 {
			select {
			case d, ok := <-deliveries:
				if !ok {
					return errors.New("the broker closed the consumer of the ticks")
				}
				tick, _ := time.Parse(time.RFC3339Nano, fmt.Sprint(d.Headers[scheduler.MetadataTick]))
				if seen[d.MessageId] {
					// A scheduler killed after publishing a tick and before recording it leaves
					// its successor to publish it again, with the same id (docs/scheduling.md):
					// a consumer handles it once by its id.
					copies++
					say("tick %s again, the same id: a copy, handled once by its id", tick.Format("15:04:05"))
					continue
				}
				seen[d.MessageId] = true
				k--
				got = append(got, tick)
				say("tick %s arrived %s after it was due (id %s)", tick.Format("15:04:05"), time.Since(tick).Round(time.Millisecond), d.MessageId)
			case <-time.After(3*every + 10*time.Second):
				return errors.New("no tick came")
			}
		}
		return nil
	}
	if err := show(n); err != nil {
		return err
	}
	_ = first.cmd.Process.Kill()
	_ = first.cmd.Wait()
	killed := time.Now()
	say("killed %s (SIGKILL)", first.name)
	next := <-active
	say("%s is active, %s after the kill", next.name, time.Since(killed).Round(time.Millisecond))
	if err := show(n); err != nil {
		return err
	}
	for i := 1; i < len(got); i++ {
		if gap := got[i].Sub(got[i-1]); gap != every {
			return fmt.Errorf("ticks %s and %s are %s apart: lost or twice", got[i-1].Format(time.TimeOnly), got[i].Format(time.TimeOnly), gap)
		}
	}
	note := ""
	if copies > 0 {
		note = fmt.Sprintf(" (%d copies of a tick id)", copies)
	}
	say("%d ticks, each %s after the one before: no tick lost, none twice%s", len(got), every, note)

	// The tick the active scheduler published ahead is delivered when due even though no
	// scheduler runs any more: wait for it, so that the queue is deleted empty (a tick that
	// found its queue gone would be parked).
	stopAll()
	say("stopped the schedulers")
	g, _, err := scheduler.ReadGroup(context.Background(), conn, scheduler.DefaultPrefix, group)
	if err != nil {
		return err
	}
	last := g.Jobs["report"].Next
	for len(got) == 0 || got[len(got)-1].Before(last) {
		if err := show(1); err != nil {
			return err
		}
	}
	say("the tick published ahead came with no scheduler running")
	return nil
}

// declare declares the ticks' queue as warren declares a work queue (as the scheduler's
// publisher does before its first publish), to consume it from the start.
func declare(conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	b, err := topology.NewBuilder(topology.Config{}, nil)
	if err != nil {
		return err
	}
	return b.DeclareQueue(context.Background(), ch, topology.Queue{Name: queue})
}

// clean deletes the ticks' queue (with its poison queue and kill exchange) and the group's
// queues.
func clean(conn *amqp.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	for _, q := range []string{queue, topology.PoisonQueue(queue), scheduler.LockQueue(scheduler.DefaultPrefix, group),
		scheduler.StateQueue(scheduler.DefaultPrefix, group)} {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return err
		}
	}
	return ch.ExchangeDelete(topology.KillExchange(queue), false, false)
}
