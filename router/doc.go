// Package router runs Watermill handlers on RabbitMQ work queues with warren's default
// middleware chain (see Router): competing consumers, consumer groups of a topic, retries with
// a delay per attempt, a poison queue that says why, tracing, graceful shutdown and reconnects.
//
// Its Subscriber is a Watermill message.Subscriber of its own (concurrent handlers, a graceful
// close, cancel is not deletion, hostile headers poisoned), usable without the Router. Every
// subscription obeys the commands of the kill topic, which a kill.Killer sends: stop, resume,
// or drain and delete the queue (see Subscriber).
package router
