package main

import (
	"context"
	"errors"
	"sync"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// The floor paths count what warren's dependencies cost a message on their own, with no broker:
// Watermill's router between a subscriber and a handler, and an OpenTelemetry SDK span. A goal
// below raw amqp091-go plus these is out of reach while warren is built on them.

// memSubscriber delivers n messages made beforehand, up to inFlight of them unacknowledged at
// a time, as a Watermill subscriber, and closes its channel when all are acknowledged.
type memSubscriber struct {
	msgs     []*message.Message
	inFlight int
}

func newMemSubscriber(n, inFlight int) *memSubscriber {
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage(watermill.NewUUID(), make([]byte, 256))
	}
	return &memSubscriber{msgs: msgs, inFlight: inFlight}
}

func (s *memSubscriber) Subscribe(ctx context.Context, _ string) (<-chan *message.Message, error) {
	out := make(chan *message.Message)
	slots := make(chan struct{}, s.inFlight)
	var wg sync.WaitGroup
	go func() {
		defer close(out)
		for _, m := range s.msgs {
			slots <- struct{}{}
			wg.Add(1)
			go func() { // waits for the acknowledgement, as a broker's subscriber does
				defer wg.Done()
				select {
				case <-m.Acked():
				case <-m.Nacked():
				}
				<-slots
			}()
			out <- m
		}
		wg.Wait()
	}()
	return out, nil
}

func (*memSubscriber) Close() error { return nil }

// floorLoop takes the messages of a memSubscriber in a loop and acknowledges each: the cost
// floorRouter's is compared with.
func floorLoop(n int) error {
	s := newMemSubscriber(n, 64)
	w := startSpan()
	ch, _ := s.Subscribe(context.Background(), "")
	for m := range ch {
		m.Ack()
	}
	w.stop()
	return nil
}

// floorRouter runs the messages of a memSubscriber through a Watermill router with no
// middleware and a handler that returns nil.
func floorRouter(n int) error {
	s := newMemSubscriber(n, 64)
	r, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	var count int
	done := make(chan struct{})
	var mu sync.Mutex
	r.AddConsumerHandler("floor", "floor", s, func(*message.Message) error {
		mu.Lock()
		count++
		if count == n {
			close(done)
		}
		mu.Unlock()
		return nil
	})
	w := startSpan()
	go func() { _ = r.Run(context.Background()) }()
	<-done
	w.stop()
	return r.Close()
}

// floorSpan starts and ends one consumer span a message on an SDK tracer provider with a
// batching processor that discards, as consume-sdk's.
func floorSpan(n int) error {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tr := tp.Tracer("floor")
	ctx := context.Background()
	w := startSpan()
	for range n {
		_, sp := tr.Start(ctx, "floor process", trace.WithSpanKind(trace.SpanKindConsumer))
		sp.End()
	}
	w.stop()
	return nil
}

// floorSink keeps each message floorMessage makes on the heap, as a subscriber's would be.
var floorSink *message.Message

// floorMessage makes a Watermill message as a subscriber makes one of a delivery: its id, its
// body and three headers as metadata, with a context.
func floorMessage(n int) error {
	body := make([]byte, 256)
	headers := map[string]any{"a": "1", "b": "2", "c": "3"}
	ctx := context.Background()
	w := startSpan()
	for range n {
		m := message.NewMessage("0123456789abcdef0123456789abcdef", body)
		for k, v := range headers {
			m.Metadata.Set(k, v.(string))
		}
		m.SetContext(ctx)
		floorSink = m
	}
	w.stop()
	if floorSink.UUID == "" {
		return errors.New("floor-message: no message made")
	}
	return nil
}
