package router

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/warrenmq/warren"
)

// Run declares the handlers' queues, exchanges and bindings and runs the handlers until ctx
// ends, Close is called or (with Config.HandleSignals) the process gets SIGINT or SIGTERM;
// then it shuts down gracefully (see Close). Run returns an error after Close, and when it
// runs already.
func (r *Router) Run(ctx context.Context) error {
	r.mu.Lock()
	switch {
	case r.closed:
		r.mu.Unlock()
		return fmt.Errorf("router: Run after Close: router is %w", warren.ErrClosed)
	case r.runDone != nil:
		r.mu.Unlock()
		return errors.New("router: Run called twice")
	}
	runDone := make(chan struct{})
	r.runDone = runDone
	topo, subs := r.topo, r.subs
	r.mu.Unlock()

	declareCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { // Close ends the declaration
		select {
		case <-r.closing:
			cancel()
		case <-declareCtx.Done():
		}
	}()
	err := r.out.Declare(declareCtx, topo) // retries go to queues that exist
	select {
	case <-r.closing: // closed before the handlers ran
		close(runDone)
		return r.Close()
	default:
	}
	if err != nil { // Run may be called again
		r.mu.Lock()
		r.runDone = nil
		r.mu.Unlock()
		close(runDone)
		return fmt.Errorf("router: %w", err)
	}
	if r.cfg.HandleSignals {
		var stop context.CancelFunc
		ctx, stop = signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
	}
	go func() {
		select {
		case <-ctx.Done():
			r.logger.Info("Shutting down", watermill.LogFields{"cause": context.Cause(ctx)})
			_ = r.Close()
		case <-runDone:
		}
	}()
	go func() { // Running: Watermill's handlers run, and every subscription consumes
		select {
		case <-r.wm.Running():
		case <-runDone:
			return
		}
		for _, sub := range subs {
			select {
			case <-sub.Ready():
			case <-runDone:
				return
			}
		}
		close(r.running)
	}()
	// Watermill's router stops its handlers when its context ends, without the graceful
	// close; Close does that, so Watermill's gets a context that does not end.
	err = r.wm.Run(context.WithoutCancel(ctx))
	close(runDone)
	// A queue deleted under its handler: never nil with work left.
	return errors.Join(err, r.Close(), r.subsErr())
}

// Running is closed once the handlers run: every handler's subscription listens to its
// queue's kill topic and consumes (or is paused by a kill command). A message published,
// or a kill sent, after that is seen at once.
func (r *Router) Running() <-chan struct{} { return r.running }

// Close stops every handler from taking messages, waits up to Config.ShutdownTimeout for
// those in flight to be processed and acked, returns the rest to their queues, and closes
// the connections. A message whose handler finished in time is never processed again.
// Close on a router whose handlers never ran closes its connections at once; Close may be
// called more than once.
func (r *Router) Close() error {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		runDone, subs := r.runDone, r.subs
		r.mu.Unlock()
		close(r.closing)

		var err error
		if r.handlersRan(runDone) {
			err = r.wm.Close()
		} else { // Watermill's Close would wait for handlers that never started
			for _, sub := range subs {
				err = errors.Join(err, sub.Close())
			}
		}
		// The subscribers are closed: their connections go, then the publishers' one.
		r.closeErr = errors.Join(err, r.subConns.Close(), r.out.Close(), r.retries.Close(), r.direct.Close(), r.pubConn.Close())
	})
	return r.closeErr
}

// handlersRan reports whether Watermill's router started the handlers, waiting for a Run
// that is starting them (runDone is nil if Run was never called).
func (r *Router) handlersRan(runDone chan struct{}) bool {
	if runDone == nil {
		return false
	}
	select {
	case <-r.wm.Running():
		return true
	case <-runDone:
		select {
		case <-r.wm.Running():
			return true
		default:
			return false
		}
	}
}

// allStopped is what Watermill's router logs, as an error, when every handler has stopped
// without a Close: their subscriptions ended.
const allStopped = "All handlers stopped, closing router"

// stopLogger is the logger of Watermill's router. A subscription ends without an error only
// when a kill command drained and deleted its queue (see consumer.Subscriber.Err): when every
// handler stopped that way the stop is deliberate, and allStopped is logged at Info, not as an
// error.
type stopLogger struct {
	watermill.LoggerAdapter
	r *Router
}

func (l stopLogger) Error(msg string, err error, fields watermill.LogFields) {
	if msg == allStopped && l.r.subsErr() == nil {
		l.Info(msg, fields.Add(watermill.LogFields{"cause": "a kill command deleted every handler's queue"}))
		return
	}
	l.LoggerAdapter.Error(msg, err, fields)
}

func (l stopLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return stopLogger{l.LoggerAdapter.With(fields), l.r}
}

// subsErr reports the subscriptions of the handlers that ended for good (see
// consumer.Subscriber.Err).
func (r *Router) subsErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	for _, sub := range r.subs {
		err = errors.Join(err, sub.Err())
	}
	return err
}
