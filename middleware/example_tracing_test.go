package middleware_test

import (
	"context"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/warrenmq/warren/middleware"
)

// Tracing on a bare Watermill router: the publisher starts a producer span and puts its
// context in the message metadata, the middleware continues that trace in a consumer span.
func ExampleTracing() {
	spans := tracetest.NewSpanRecorder() // in production: an OTLP exporter
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	tracing, err := middleware.NewTracing(middleware.TracingConfig{TracerProvider: provider})
	if err != nil {
		panic(err)
	}

	pubSub := gochannel.NewGoChannel(gochannel.Config{BlockPublishUntilSubscriberAck: true}, watermill.NopLogger{})
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		panic(err)
	}
	router.AddMiddleware(tracing.Middleware)
	traceIDs := make(chan string, 1)
	router.AddConsumerHandler("orders", "orders", pubSub, func(msg *message.Message) error {
		traceIDs <- middleware.TraceID(msg) // for logs: correlate them with the trace
		return nil
	})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = router.Run(ctx) }()
	<-router.Running()

	publisher := tracing.Publisher(pubSub)
	if err := publisher.Publish("orders", message.NewMessage("order-1", []byte(`{"id":1}`))); err != nil {
		panic(err)
	}
	traceID := <-traceIDs
	_ = router.Close()

	ended := spans.Ended() // the consumer span ends first: Publish waits for the ack
	process, send := ended[0], ended[1]
	fmt.Println(send.Name(), send.SpanKind())
	fmt.Println(process.Name(), process.SpanKind())
	fmt.Println("process is a child of send:", process.Parent().SpanID() == send.SpanContext().SpanID())
	fmt.Println("handler saw the trace:", traceID == send.SpanContext().TraceID().String())
	// Output:
	// send orders producer
	// process orders consumer
	// process is a child of send: true
	// handler saw the trace: true
}
