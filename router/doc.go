// Package router runs Watermill handlers on RabbitMQ work queues with warren's default
// middleware chain (see Router): competing consumers, consumer groups of a topic, retries with
// a delay per attempt, a poison queue that says why, tracing, metrics, graceful shutdown and
// reconnects. A handler with HandlerConfig.Reply is the server side of package rpc.
//
// Each handler consumes through a consumer.Subscriber, package consumer's Watermill
// message.Subscriber (concurrent handlers, a graceful close, cancel is not deletion, hostile
// headers poisoned), which is usable without the Router. Every subscription obeys the
// commands of the kill topic, which a kill.Killer sends: stop, resume, or drain and delete the
// queue (see consumer.Subscriber).
//
// A Router connects once per role, not per handler: it consumes on one connection, each handler
// on a channel of its own (its kill topic listener, its count among the listeners and its kill
// state on channels of that connection too), and publishes on another (Router.Publisher, what handlers return, retries,
// poison copies, replies to direct reply-to addresses and to reply queues, answers to kill
// commands; each kind on a confirm channel of its own), so that flow control, which blocks a
// connection that publishes, does not hold up consuming. (One publish stays on the consuming
// connection: a subscription that starts and finds a kill command in its queue's kill state
// puts the command back there, on the channel it read it on.) A failure of one handler's
// channel (its queue deleted, its consumer cancelled, a slow handler) is that handler's alone;
// a consume the broker refuses by closing the whole connection (541 INTERNAL_ERROR, for a
// quorum queue that is down) is retried on a third connection, which only such handlers use,
// until it is served. Each connection is opened again by itself once lost, on any node of
// Config.Connection.URL, and told to Connection.OnEvent. Every handler takes three channels of
// the consuming connection, and a few more for moments: the broker's channel_max (2047 by
// default; Connection.AMQP.ChannelMax) bounds the handlers of one Router to several hundred. A
// consumer.Subscriber, kill.Killer or dlx.Publisher made on its own has connections of its own
// (see warren.Connection).
//
// The chain's order and why each middleware sits where it does, consuming, shutdown and
// tracing are in [docs/handlers.md]; the kill topic, its confirmations and its secret in
// [docs/kill.md].
//
// [docs/handlers.md]: https://github.com/warrenmq/warren/blob/main/docs/handlers.md
// [docs/kill.md]: https://github.com/warrenmq/warren/blob/main/docs/kill.md
package router
