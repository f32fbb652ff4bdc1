package router_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/handlers"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

type greeting struct {
	Name string `json:"name"`
}

// A typed handler on a work queue: its first attempt fails, the retry 100ms later succeeds.
func ExampleRouter() {
	delay := topology.Delay{Prefix: "warren.example.router.delay"} // the default is warren.delay
	const queue = "warren.example.router.greetings"
	defer removeExample(delay, queue)

	r, err := router.New(router.Config{
		Connection: warren.Connection{URL: testenv.URL()},
		Topology:   topology.Config{Delay: delay},
		Retry:      middleware.BackoffConfig{Delays: []time.Duration{100 * time.Millisecond}},
	}, nil)
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	err = r.AddConsumerHandler(router.HandlerConfig{Queue: queue},
		handlers.JSON(func(ctx context.Context, g greeting) error {
			attempt := middleware.AttemptFromContext(ctx)
			if attempt == 1 {
				fmt.Println("attempt 1: failing")
				return errors.New("not yet")
			}
			fmt.Printf("attempt %d: hello, %s\n", attempt, g.Name)
			close(done)
			return nil
		}))
	if err != nil {
		panic(err)
	}
	go func() { _ = r.Run(context.Background()) }() // until Close, SIGINT or SIGTERM
	<-r.Running()

	msg, _ := handlers.NewJSON(context.Background(), greeting{Name: "warren"})
	if err := r.Publisher().Publish(queue, msg); err != nil {
		panic(err)
	}
	<-done
	_ = r.Close()
	// Output:
	// attempt 1: failing
	// attempt 2: hello, warren
}

// Stop every consumer of a queue, in every process, then let them go on.
func ExampleKiller() {
	delay := topology.Delay{Prefix: "warren.example.killer.delay"}
	const queue = "warren.example.killer.jobs"
	defer removeExample(delay, queue)

	stopped, resumed := make(chan struct{}), make(chan struct{})
	r, err := router.New(router.Config{
		Connection: warren.Connection{URL: testenv.URL()},
		Subscriber: router.SubscriberConfig{OnKill: func(e router.KillEvent) {
			fmt.Println(e.Queue, e.State)
			switch e.State { // (any other state must not block: OnKill runs in the consumer)
			case "stopped":
				stopped <- struct{}{}
			case "resumed":
				resumed <- struct{}{}
			}
		}},
		Topology:      topology.Config{Delay: delay},
		IgnoreSignals: true,
	}, nil)
	if err != nil {
		panic(err)
	}
	defer r.Close()
	_ = r.AddConsumerHandler(router.HandlerConfig{Queue: queue}, handlers.JSON(func(context.Context, greeting) error { return nil }))
	go func() { _ = r.Run(context.Background()) }()
	<-r.Running()
	time.Sleep(100 * time.Millisecond) // the consumer listens to the kill topic

	k, err := router.NewKiller(router.KillerConfig{Connection: warren.Connection{URL: testenv.URL()}}, nil)
	if err != nil {
		panic(err)
	}
	_ = k.Kill(context.Background(), queue, router.Stop)
	<-stopped
	_ = k.Resume(context.Background(), queue)
	<-resumed
	// Output:
	// warren.example.killer.jobs stopped
	// warren.example.killer.jobs resumed
}

// removeExample deletes what an example declared.
func removeExample(d topology.Delay, queue string) {
	qs, xs := d.Names()
	wq, wx := testenv.WorkQueueNames(queue)
	_ = testenv.DeleteAt(testenv.URL(), append(qs, wq...), append(xs, wx...))
}
