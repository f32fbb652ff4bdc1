package router

import (
	"fmt"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/warrenmq/warren"
)

// workers run a handler's chain on goroutines that live as long as the router. Watermill's
// router starts a goroutine for every message, and a new goroutine's stack is small (2 KiB):
// the chain outgrows it, so the runtime copied every message's stack once or twice while it
// was deep in the chain, which cost more than the handler's own work (docs/decisions.md,
// "Consuming: a chain on goroutines of its own"). A worker's stack grows once, and Watermill's
// goroutine only hands the message over and waits for the result.
type workers struct {
	chain message.HandlerFunc
	jobs  chan job      // unbuffered: a send goes through when a worker is idle
	quit  chan struct{} // closed by stop
	wg    sync.WaitGroup

	mu      sync.Mutex
	started int // workers started, up to max: one more when none is idle
	max     int
	stopped bool
}

// job is a message for a worker, and where its result goes.
type job struct {
	msg  *message.Message
	done chan result
}

// result is what the chain returned, or the value it panicked with.
type result struct {
	err      error
	panicked any
	panics   bool
}

// errWorkersStopped is the error of a message handed over after the router closed: it goes
// back to the queue.
var errWorkersStopped = fmt.Errorf("router: handler workers are stopped: router is %w", warren.ErrClosed)

// results are the result channels of jobs, used again once read.
var results = sync.Pool{New: func() any { return make(chan result, 1) }}

// newWorkers returns the workers of handle, up to n at once; they start as messages come.
func newWorkers(n int, chain message.HandlerFunc) *workers {
	return &workers{chain: chain, jobs: make(chan job), quit: make(chan struct{}), max: n}
}

func (w *workers) work() {
	defer w.wg.Done()
	for {
		select {
		case j := <-w.jobs:
			j.done <- run(w.chain, j.msg)
		case <-w.quit:
			return
		}
	}
}

// run runs handle with msg on the worker and returns its result; a panic is caught, to be
// raised again on Watermill's goroutine, whose recovery nacks the message.
func run(handle message.HandlerFunc, msg *message.Message) (r result) {
	defer func() {
		if v := recover(); v != nil {
			r = result{panicked: v, panics: true}
		}
	}()
	_, err := handle(msg)
	return result{err: err}
}

// handle runs msg on a worker and returns the chain's error, or raises its panic.
func (w *workers) handle(msg *message.Message) error {
	done := results.Get().(chan result)
	j := job{msg: msg, done: done}
	select {
	case w.jobs <- j:
	default: // none is idle: one more, unless all are busy (Watermill hands out no more than max)
		w.mu.Lock()
		if w.started < w.max && !w.stopped {
			w.started++
			w.wg.Add(1)
			go w.work()
		}
		w.mu.Unlock()
		select {
		case w.jobs <- j:
		case <-w.quit:
			results.Put(done)
			return errWorkersStopped
		}
	}
	r := <-done
	results.Put(done)
	if r.panics {
		panic(r.panicked)
	}
	return r.err
}

// stop ends the workers: an idle one at once, a busy one once its message has its result.
// It waits for them unless wait is false (a handler still runs after Watermill gave up on it).
func (w *workers) stop(wait bool) {
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	close(w.quit)
	if wait {
		w.wg.Wait()
	}
}
