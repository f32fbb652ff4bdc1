// Package rpc is request/reply over RabbitMQ: a Client that sends a request and waits for
// its reply (Call), or sends and forgets (Send), and the server side, which is a router
// handler with router.HandlerConfig.Reply set: the message the handler returns goes to the
// request's reply-to, with the request's correlation id, once the handler has succeeded.
//
// # The client
//
// Call publishes the request with a new correlation id and a reply-to, with publisher
// confirms and the mandatory flag (a request no queue takes fails at once, with a
// *dlx.ReturnedError, instead of timing out), and waits for the reply until its context ends
// or ClientConfig.Timeout has elapsed, whichever comes first; the error then wraps
// context.DeadlineExceeded (or the context's cause). Send publishes the same way, without a
// reply-to, and returns once the broker has confirmed the request. Neither declares the
// destination: a request is for a server that consumes already.
//
// Two ways to receive replies, chosen by ClientConfig.ReplyQueue:
//
//   - Direct reply-to (ReplyQueue empty, the default): RabbitMQ's amq.rabbitmq.reply-to
//     pseudo-queue. No queue is declared, nothing is stored; a reply goes straight to the
//     client's channel. At most once: a reply sent while the client is disconnected is lost,
//     and the calls waiting when the connection drops fail at once with ErrReplyLost (the
//     server may still process the request). Best for calls that are cheap to repeat.
//   - A reply queue (ReplyQueue set): a durable queue of that name, declared by the client
//     (quorum by default, ClientConfig.ReplyQueueType), which deletes itself after
//     ClientConfig.ReplyQueueExpires without a consumer (a client that crashed leaves
//     nothing for long); Close deletes it. Replies are acked once handed to their caller, so
//     a reply sent while the client reconnects waits in the queue and the call still gets it
//     within its time limit. The name must be the client's own, not shared by the replicas
//     of a service: a second client consuming it is refused (a classic queue refuses its
//     exclusive consumer; a quorum queue, which RabbitMQ lets a second consumer take even
//     then, has its consumers counted). A client closed while it reconnects leaves its
//     queue to x-expires.
//
// Direct reply-to costs nothing to set up and is the faster of the two; a reply queue is for
// calls whose replies must survive a dropped connection (a long call, a flaky network), at
// the price of a queue per client. A reply that arrives after its call gave up is dropped
// (and acked). Requests are traced (ClientConfig.TracerProvider): the server's processing
// and its reply belong to the caller's trace.
//
// # The server
//
// A handler registered with router.HandlerConfig{Queue: "rates", Reply: true} replies: each
// message it returns is published to the request's reply-to (the default exchange, the
// reply-to as routing key) with the request's correlation id (its message id when it has
// none), inside the middleware chain and only after the handler succeeded. A request sent
// with Send has no reply-to: the handler's reply is then dropped. A reply to a caller that is
// gone is dropped and the request acked, never retried or poisoned: the broker returns a
// reply to a reply queue that no longer exists, which is logged; a reply to a direct
// reply-to address is published without the mandatory flag (RabbitMQ 3.10.8 and 4.0.5
// return every such reply to a mandatory publisher, delivered or not: a return would say
// nothing) and the broker drops it when its caller is gone. A request that ends in the poison queue (a permanent error,
// or its last attempt failed) is answered with an error reply, which Call returns as a
// *RemoteError: the caller learns at once that and why its request was given up. A handler
// that returns no message sends no reply (it may have forwarded the request, reply-to and
// correlation id included, to another server that answers). A delivery the subscriber
// poisons before any handler sees it (it cannot be unmarshaled, its headers cannot be read)
// gets no error reply: its call times out.
//
// Handler and the function Call are the typed forms, with JSON bodies, like handlers.JSON.
//
// # Properties
//
// The correlation id and reply-to travel as the AMQP properties (foreign clients and servers
// understand them) and in the metadata keys warren.MetadataCorrelationID and
// warren.MetadataReplyTo, where handlers read them.
package rpc
