// Package router runs Watermill handlers on RabbitMQ work queues with warren's default
// middleware chain (see Router): competing consumers, consumer groups of a topic, retries with
// a delay per attempt, a poison queue that says why, tracing, metrics, graceful shutdown and
// reconnects. A handler with HandlerConfig.Reply is the server side of package rpc.
//
// Its Subscriber is a Watermill message.Subscriber of its own (concurrent handlers, a graceful
// close, cancel is not deletion, hostile headers poisoned), usable without the Router. Every
// subscription obeys the commands of the kill topic, which a kill.Killer sends: stop, resume,
// or drain and delete the queue (see Subscriber).
//
// The chain's order and why each middleware sits where it does, consuming, shutdown and
// tracing are in [docs/handlers.md]; the kill topic, its confirmations and its secret in
// [docs/kill.md].
//
// [docs/handlers.md]: https://github.com/warrenmq/warren/blob/main/docs/handlers.md
// [docs/kill.md]: https://github.com/warrenmq/warren/blob/main/docs/kill.md
package router
