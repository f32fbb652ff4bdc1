// Package consumer is the consume side of warren: its Subscriber is a Watermill
// message.Subscriber for RabbitMQ work queues (concurrent handlers, a graceful close, cancel
// is not deletion, hostile headers poisoned), usable without a router. Package router builds
// one per handler, on connections the router shares among its handlers.
//
//	s, err := consumer.NewSubscriber(consumer.Config{Connection: conn, HandlerName: "billing"}, logger)
//	msgs, err := s.Subscribe(ctx, "billing") // the topic is the queue's name
//	for msg := range msgs {
//		// handle, then msg.Ack() or msg.Nack()
//	}
//
// A subscription hands out up to Config.Concurrency messages at once and settles each on the
// channel it came from once it is acked or nacked (a nack goes back to the queue after
// Config.RequeueDelay); a copy of a message acked lately (the same publish id) is acked at
// once; a delivery that cannot be unmarshaled, or whose headers cannot be read, goes to the
// queue's poison queue with the reason. A lost channel or connection is consumed again on a
// new one, with backoff; a queue deleted under it ends the subscription (see Subscriber.Err).
//
// Every subscription is the receiving side of warren's kill switch, whose sending side is
// package kill: it listens to its queue's kill topic, reads the last command from the
// queue's kill state when it starts, and obeys stop, resume, and drain-and-delete, telling
// Config.OnKill (KillEvent) and answering commands that carry a reply address (see
// Subscriber).
//
// Consuming, shutdown and the kill topic are described in [docs/handlers.md] and
// [docs/kill.md].
//
// [docs/handlers.md]: https://github.com/warrenmq/warren/blob/main/docs/handlers.md
// [docs/kill.md]: https://github.com/warrenmq/warren/blob/main/docs/kill.md
package consumer
