package rpc

import (
	"fmt"
	"strings"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/topology"
)

// ClientConfig configures a Client.
type ClientConfig struct {
	// Connection says how to reach the broker (URL required). A lost connection is opened
	// again at once, with backoff, for as long as the client is open.
	Connection warren.Connection
	// Route maps a topic to where its requests are published. Default dlx.ToQueue (the
	// server's queue, named like the topic). The destination is never declared.
	Route func(topic string) dlx.Route
	// ReplyQueue, when set, is the name of the client's own reply queue; empty (the
	// default) uses RabbitMQ's direct reply-to. See the package doc for the choice.
	ReplyQueue string
	// ReplyQueueType is the type of the reply queue. Default topology.Quorum.
	ReplyQueueType topology.QueueType
	// ReplyQueueExpires is how long the reply queue lives without a consumer before the
	// broker deletes it (x-expires): longer than the client may stay disconnected. Default
	// DefaultReplyQueueExpires.
	ReplyQueueExpires time.Duration
	// Timeout bounds a Call (publishing and waiting for the reply) and a Send, unless its
	// context ends earlier. Default DefaultTimeout.
	Timeout time.Duration
	// Marshaler turns requests into publishings and replies into messages. Default
	// warren.Marshaler{}.
	Marshaler wamqp.Marshaler
	// TracerProvider traces requests: a producer span per request (until the broker's
	// confirmation), a child of the span in the context of Call or Send (or of the
	// message), whose trace context travels in the request's metadata, so that the
	// server's processing and its reply belong to the caller's trace. Default:
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
}

// Defaults of ClientConfig.
const (
	DefaultTimeout           = 30 * time.Second
	DefaultReplyQueueExpires = 10 * time.Minute
)

// WithDefaults returns c with every unset field set to its default.
func (c ClientConfig) WithDefaults() ClientConfig {
	c.Connection = c.Connection.WithDefaults()
	if c.Route == nil {
		c.Route = dlx.ToQueue
	}
	if c.ReplyQueueType == "" {
		c.ReplyQueueType = topology.Quorum
	}
	if c.ReplyQueueExpires == 0 {
		c.ReplyQueueExpires = DefaultReplyQueueExpires
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Marshaler == nil {
		c.Marshaler = warren.Marshaler{}
	}
	return c
}

// Validate reports the first field of c that is not usable. No error contains a password
// of ClientConfig.Connection.URL.
func (c ClientConfig) Validate() error {
	if err := c.Connection.Validate(); err != nil {
		return fmt.Errorf("rpc: ClientConfig.%w", err)
	}
	switch {
	case c.Timeout < 0:
		return fmt.Errorf("rpc: ClientConfig.Timeout %s is negative", c.Timeout)
	case c.ReplyQueueExpires < 0:
		return fmt.Errorf("rpc: ClientConfig.ReplyQueueExpires %s is negative", c.ReplyQueueExpires)
	case c.ReplyQueueExpires > 0 && c.ReplyQueueExpires < time.Millisecond:
		return fmt.Errorf("rpc: ClientConfig.ReplyQueueExpires %s is below 1ms", c.ReplyQueueExpires)
	case strings.HasPrefix(c.ReplyQueue, "amq."):
		return fmt.Errorf("rpc: ClientConfig.ReplyQueue %q: names starting with amq. are the broker's "+
			"(leave it empty for direct reply-to)", c.ReplyQueue)
	case len(c.ReplyQueue) > 255:
		return fmt.Errorf("rpc: ClientConfig.ReplyQueue is %d bytes long, the limit is 255", len(c.ReplyQueue))
	case c.ReplyQueueType != "" && c.ReplyQueueType != topology.Quorum && c.ReplyQueueType != topology.Classic:
		return fmt.Errorf("rpc: ClientConfig.ReplyQueueType %q is neither %q nor %q", c.ReplyQueueType, topology.Quorum, topology.Classic)
	}
	return nil
}
