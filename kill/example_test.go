package kill_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// Stop every consumer of a queue, in every process, and let them go on; then have them
// drain the queue and delete it. The consumers are a router's (consumer.Subscriber obeys the
// kill topic); its OnKill hears what each does.
func ExampleKiller() {
	url := os.Getenv("WARREN_AMQP_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	const queue = "warren.example.killer.jobs"
	ctx := context.Background()

	events := make(chan router.KillEvent, 16)
	r, err := router.New(router.Config{
		Connection: warren.Connection{URL: url},
		OnKill: func(e router.KillEvent) {
			select { // OnKill runs in the consumer: it must never block
			case events <- e:
			default:
			}
		},
		// This handler never fails, so it needs no delayed retries, and no delay levels.
		Topology: topology.Config{Delay: topology.Delay{Disabled: true}},
	}, nil)
	if err != nil {
		panic(err)
	}
	defer r.Close()
	err = r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, func(*message.Message) error { return nil })
	if err != nil {
		panic(err)
	}
	go func() { _ = r.Run(ctx) }()
	<-r.Running()

	// In another process, or with `warren kill`: a Killer reaches every consumer of the queue.
	k, err := kill.NewKiller(kill.Config{Connection: warren.Connection{URL: url}}, nil)
	if err != nil {
		panic(err)
	}
	// A consumer that is not listening yet (ErrNoListener) obeys the kill when it starts.
	if err := k.Kill(ctx, queue, kill.Stop); err != nil && !errors.Is(err, kill.ErrNoListener) {
		panic(err)
	}
	e := <-events
	fmt.Println(e.Queue, e.State)
	if err := k.Resume(ctx, queue); err != nil {
		panic(err)
	}
	e = <-events
	fmt.Println(e.Queue, e.State)
	// Delete: the consumers drain the queue, then delete it, its poison queue and kill exchange.
	if err := k.Kill(ctx, queue, kill.Delete); err != nil {
		panic(err)
	}
	for e := range events {
		fmt.Println(e.Queue, e.State)
		if e.State == "deleted" {
			break
		}
	}
	// Output:
	// warren.example.killer.jobs stopped
	// warren.example.killer.jobs resumed
	// warren.example.killer.jobs draining
	// warren.example.killer.jobs deleted
}
