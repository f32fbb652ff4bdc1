// Package dlx is warren's publisher: a Watermill message.Publisher for RabbitMQ that
// publishes at once or after any delay, without a broker plugin.
//
// # Delays
//
// A delay is set with warren.Delay or warren.DeliverAt, or with Watermill's own
// components/delay metadata (delay.Message(msg, delay.For(d)) or delay.Until(t)). A message
// without one is published at once. A delayed message travels through the fixed-TTL queues
// of the delay levels (see topology.Delay): a fixed number of queues whatever the delays, no
// head-of-line blocking, and the delay rounded up to the unit, so that no message is ever
// delivered early. It keeps its routing key: a delayed message to a topic exchange is
// routed by pattern on arrival exactly as an immediate one. A destination deleted while
// messages waited sends them to the parking queue (Publisher.Parked), never stalling a
// level. A negative delay, one above topology.Delay.Max, or a DeliverAt time further in
// the past than Config.PastTolerance is an error naming the value.
//
// warren's own delay metadata is consumed by Publish, not sent: a consumer that publishes
// what it received does not delay it again. Watermill's metadata is sent on (Watermill's
// DelayOnError reads it back); Watermill writes its until time in whole seconds, and Publish
// reads the pair so that the message is never early and, once the until time has fully
// passed, is not delayed again (see [docs/publishing.md]).
//
// # Confirms
//
// Publish returns nil only when the broker has confirmed every message. Messages are
// published with the mandatory flag (unless Config.AllowUnroutable): a message no queue
// takes is returned by the broker and Publish fails with a *ReturnedError; a nacked message
// is published again, with backoff, until Config.PublishTimeout, and then fails it with
// ErrNacked. Many messages are in flight on one channel at once, from one Publish call
// or from many goroutines. Every broker call (dial, declare, publish) is retried with
// backoff until a time limit, then fails with an error that says so.
//
// # Destinations
//
// Config.Route maps a Watermill topic to an exchange and routing key (ToQueue,
// ToExchange, ExchangePerTopic). The destination is declared before the first publish to it
// (a queue as a warren work queue, an exchange as listed in Config.Declare or of kind
// topology.Config.ExchangeKind), so nothing published before the first consumer is lost.
//
// [docs/publishing.md] walks through publishing and the delay levels, with a diagram.
//
// [docs/publishing.md]: https://github.com/warrenmq/warren/blob/main/docs/publishing.md
package dlx
