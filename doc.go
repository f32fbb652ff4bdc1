// Package warren runs event-driven pipelines on RabbitMQ, on top of Watermill
// (github.com/ThreeDotsLabs/watermill): messages published at once or after any delay,
// without a broker plugin; publishes that return only once the broker has confirmed them;
// handlers that run concurrently, with retries on a schedule and a poison queue that says
// why; traces that follow a message across every hop; a switch that stops every consumer of a
// queue, in every process; request/reply; scheduled messages that can be listed and
// cancelled, and recurring jobs; an operations API and a dashboard; and a topology builder
// that declares it all.
//
// This package holds what the others share: the [Connection] to the broker, the [Marshaler]
// between Watermill messages and AMQP, the [Delivery] a consumed message came from, and the
// names of the headers warren reads and writes. The work is done by:
//
//   - [github.com/warrenmq/warren/topology] declares exchanges, work queues, bindings and the
//     delay levels, verifies them, and reads topology files;
//   - [github.com/warrenmq/warren/dlx] publishes, with or without a delay;
//   - [github.com/warrenmq/warren/router] runs handlers on queues with warren's middleware
//     chain (its Subscriber works alone too), and obeys kill commands;
//   - [github.com/warrenmq/warren/kill] sends kill commands: stop, resume, or drain and delete
//     a queue's consumers, in every process;
//   - [github.com/warrenmq/warren/middleware] holds that chain's middleware, which work on a
//     bare Watermill router too;
//   - [github.com/warrenmq/warren/middleware/redisstore] recognises copies of a message
//     across processes, in Redis;
//   - [github.com/warrenmq/warren/handlers] adapts typed functions (JSON) to handlers;
//   - [github.com/warrenmq/warren/rpc] sends requests and waits for their replies; a router
//     handler answers them;
//   - [github.com/warrenmq/warren/ledger] lists and cancels the delayed messages published
//     with a schedule id ([Schedule]);
//   - [github.com/warrenmq/warren/scheduler] runs recurring jobs (cron, @every), with one
//     active scheduler among any number of processes;
//   - [github.com/warrenmq/warren/ops] is the operations API: status of work queues and delay
//     levels, browsing, grouping, replaying and purging poison and parked messages;
//   - [github.com/warrenmq/warren/ui] is the dashboard: ops in a browser, an http.Handler;
//   - [github.com/warrenmq/warren/cmd/warren] is the ops CLI, warren, built on them:
//     warren topology apply|verify|diagram (topology files), warren delays
//     apply|verify|remove (the delay levels alone), warren publish (one message, now or
//     delayed, confirmed), warren status (queues, kill state, poison, delay levels, parked),
//     warren poison list|replay|export|purge, warren parked list|replay, warren kill and
//     warren resume (the kill topic), warren ui (the dashboard), warren scheduled
//     list|cancel (the ledger), warren schedules list (scheduler groups and their jobs), and
//     warren completion (shell completion).
//
// # Connecting
//
// Every part of warren that talks to the broker takes a [Connection], in a field named
// Connection (dlx.Config, router.Config, consumer.Config, kill.Config,
// rpc.ClientConfig, ops.Config, ledger.Config, scheduler.Config) or, for topology.Builder's
// Apply and Verify, as an argument:
//
//	conn := warren.Connection{
//		URL: "amqp://guest:guest@127.0.0.1:5672/", // or a cluster's nodes, separated by commas
//	}
//
// Every connection tries the nodes in a random order, with backoff, until
// Connection.ConnectTimeout (30s by default), and a connection that is lost is opened again
// on whichever node answers. Connection also takes TLS settings, amqp091-go's Config
// (heartbeat, vhost, connection name) and OnEvent, which hears each connection's
// [ConnectionEvent]: connected, reconnecting, failed over. No error or log line shows a
// password.
//
// # Declaring
//
// A [github.com/warrenmq/warren/topology.Topology] describes exchanges, work queues and
// bindings; a [github.com/warrenmq/warren/topology.Builder] declares it, idempotently, or
// only verifies it:
//
//	b, err := topology.NewBuilder(topology.Config{}, logger)
//	err = b.Apply(ctx, conn, topology.Topology{
//		Exchanges: []topology.Exchange{{Name: "events", Kind: topology.Topic}},
//		Queues:    []topology.Queue{{Name: "billing"}},
//		Bindings:  []topology.Binding{{Exchange: "events", Queue: "billing", Key: "order.*"}},
//	})
//
// A work queue Q comes with its poison queue Q.poison and its kill exchange Q.kill. Work,
// poison and delay level queues are quorum queues unless topology.Config.QueueType (or
// Queue.Type for one queue) says Classic. Apply and Declare also declare the delay levels
// (see [github.com/warrenmq/warren/topology.Delay]): by default 120 queues with fixed TTLs
// that together hold a message for any delay up to 49.7 days, a chain of 73 queues that
// waits longer, up to 10 years, and a parking queue. Declaring
// is optional: a publisher declares the delay levels when it starts and a destination before
// its first publish to it, and a router declares its handlers' queues when it runs. An
// exchange or queue that exists with other arguments is a *topology.MismatchError that says
// what to do.
//
// # Publishing, with or without a delay
//
// A [github.com/warrenmq/warren/dlx.Publisher] is a Watermill message.Publisher:
//
//	pub, err := dlx.NewPublisher(dlx.Config{Connection: conn}, logger)
//	msg := message.NewMessage(watermill.NewUUID(), payload)
//	warren.Delay(msg, 90*time.Second) // or warren.DeliverAt(msg, t); without either, at once
//	err = pub.Publish("billing", msg) // nil: the broker has confirmed it
//
// Watermill's own delay metadata (components/delay: delay.Message(msg, delay.For(d))) is
// honoured too. A delayed message travels through the delay levels and reaches its
// destination with its routing key; its delay is rounded up to the unit (1ms by default), so
// it is never early. dlx.Config.Route maps a topic to its destination: dlx.ToQueue (the
// default, the work queue named like the topic), dlx.ToExchange (the topic is the routing
// key) or dlx.ExchangePerTopic. Messages are mandatory (unless dlx.Config.AllowUnroutable):
// one that no queue takes makes Publish fail with a *dlx.ReturnedError. A nacked one is
// published again until dlx.Config.PublishTimeout (30s), then Publish fails with
// dlx.ErrNacked.
//
// # Running handlers
//
// A [github.com/warrenmq/warren/router.Router] runs handlers on queues, on top of Watermill's
// message.Router:
//
//	r, err := router.New(router.Config{
//		Connection: conn,
//		Retry:      middleware.BackoffConfig{Delays: []time.Duration{time.Second, 30 * time.Second}},
//	}, logger)
//	err = r.AddConsumerHandler(router.HandlerConfig{Queue: "billing"},
//		handlers.JSON(func(ctx context.Context, o Order) error { return charge(ctx, o) }))
//	err = r.Run(ctx) // until ctx ends or Close (Config.HandleSignals: SIGINT, SIGTERM too); then a graceful shutdown
//
// Every consumer of a queue, in any process, competes for its messages;
// HandlerConfig.Exchange and Keys bind the queue to an exchange, which makes it a consumer
// group of that exchange's topic. A handler processes up to 64 messages at once by default
// (router.Config.Concurrency, or HandlerConfig.Concurrency). AddHandler takes a
// handler that returns messages, which are published to HandlerConfig.PublishTopic, and
// Router.Publisher publishes through the router's DLX publisher. [DeliveryFrom] tells a
// handler, from its message's context, where the message came from. Shutting down stops
// taking messages, waits up to router.Config.ShutdownTimeout (30s) for those in
// flight to be processed and acked, and returns the rest to their queue.
//
// Every handler runs inside warren's middleware chain: retry counting, tracing, the poison
// queue, retries, metrics, the publishing of the handler's outputs and recovered panics, and
// with router.Config.CopyStore an idempotency guard outermost. Its order, and why each
// middleware sits where it does, is in [docs/handlers.md].
//
// # Retries and the poison queue
//
// When a handler fails, Backoff republishes the message to the queue that failed (not to its
// exchange: other consumer groups never see the retry) with the next attempt number and that
// attempt's wait, through the delay levels, and acks it. The schedule is router.Config.Retry,
// or HandlerConfig.Retry for one handler: a list of waits (Delays; by default len(Delays)+1
// attempts) or, by default, exponential from 1s, doubling, capped at 5m, for 5 attempts. The
// handler reads the attempt with middleware.Attempt(msg) or
// middleware.AttemptFromContext(ctx).
//
// After the last attempt, or at once for a permanent error (warren.Permanent(err); a
// payload handlers.JSON cannot decode is one), Poison publishes the message to Q.poison with
// its body and headers and a poison record (PoisonRecord, warren_poison_* headers) that says
// why: the error, the reason, the handler, the attempts, the first and last failure, the trace
// id, and the stack of a panic. DecodePoisonRecord reads it, and also explains the messages the
// broker dead-lettered there itself (past the quorum delivery limit). A retry or poison copy
// that cannot be published is no failure of the handler: the message goes back to its queue,
// after router.Config.RequeueDelay (1s).
//
// # Copies across processes
//
// At-least-once delivery makes copies: a publish whose confirm was lost is sent again, and a
// message whose ack was lost is delivered again. The DLX publisher gives every message a
// publish id (the header warren-dlx-id), the same on every copy, and a subscriber acks at once,
// without handling it, a copy of a message it is handling or acked in the last 5 minutes. For the
// copies that reach different processes, give the router a store they share, such as
// [github.com/warrenmq/warren/middleware/redisstore.Store]:
//
//	rdb := redis.NewClient(&redis.Options{Addr: "redis:6379"}) // github.com/redis/go-redis/v9
//	store, err := redisstore.New(redisstore.Config{Client: rdb}, logger)
//	r, err := router.New(router.Config{Connection: conn, CopyStore: store}, logger)
//
// The router then runs middleware.Idempotent, keyed by middleware.CopyKey, outermost: a copy
// of a delivery that a process settled already (processed, retried or poisoned) is acked
// without being handled, and one that another process is handling waits for it (up to
// middleware.IdempotentConfig.BusyWait, then back to the queue). A claim of a process that
// died expires after the store's lease (15s). A store that fails never holds a message up:
// the message is handled as without one. The router does not close the store. For a message
// a producer sent twice with one id, or a business operation done once per key of your own,
// put middleware.Idempotent keyed by middleware.MessageIDKey (or your key) around the
// handler (HandlerConfig.Middleware).
//
// # AMQP properties
//
// [Marshaler] maps the AMQP basic properties (content type and encoding, correlation id,
// reply-to, type, app id, user id, timestamp, priority, expiration) to metadata keys
// ([MetadataContentType], ...) and back, so that they survive handlers, retries, delays, the
// poison queue and a replay, and other clients see real properties. A value the broker would
// refuse travels as a header instead, and so does the user id: no message can make a retry
// fail for ever.
//
// # Request/reply
//
// Package [github.com/warrenmq/warren/rpc] sends a request and waits for its reply (Call), or
// sends and forgets (Send), with RabbitMQ's direct reply-to or a reply queue of the client's
// own; a router handler with HandlerConfig.Reply answers, after success, and a request that
// ends in the poison queue is answered with an error reply:
//
//	r.AddHandler(router.HandlerConfig{Queue: "quotes", Reply: true},
//		rpc.Handler(func(ctx context.Context, req QuoteRequest) (Quote, error) { return lookup(ctx, req) }))
//	c, err := rpc.NewClient(rpc.ClientConfig{Connection: conn}, logger)
//	q, err := rpc.Call[QuoteRequest, Quote](ctx, c, "quotes", QuoteRequest{Symbol: "WRN"})
//
// # The kill topic
//
// A [github.com/warrenmq/warren/kill.Killer] stops every consumer of a queue, in every
// process, and lets them go on:
//
//	k, err := kill.NewKiller(kill.Config{Connection: conn}, logger)
//	err = k.Kill(ctx, "billing", kill.Stop) // or kill.Delete: drain the queue, then delete it
//	err = k.Resume(ctx, "billing")
//
// Every consumer of Q listens to Q.kill. On Stop it finishes and acks what it is handling,
// returns what it prefetched to the queue and waits for Resume; on Delete the consumers
// consume until the queue is empty, then delete it with its poison queue (if empty), kill
// exchange and kill state queue. The last command is remembered in the kill state queue
// (Q.kill.state), so consumers that start later obey it; when no consumer was listening, Kill
// and Resume return an error that wraps kill.ErrNoListener, and the command is remembered
// all the same. router.Config.OnKill hears each consumer's stopped, resumed,
// draining, deleted and refused; it is called from the consumer, and must not block. With a
// secret (router.Config.KillSecret and kill.Config.Secret), consumers obey only
// commands signed with it. The warren command sends the same commands from a shell:
//
//	warren kill billing [--delete]
//	warren resume billing
//
// It reads the broker from --url or $WARREN_AMQP_URL, and the secret from
// $WARREN_KILL_SECRET; it waits until every consumer the broker counts has confirmed (at most
// --wait, 5s) and says in its exit code whether every one did.
//
// # Scheduling
//
// [Schedule] gives a delayed message an id, recorded in a stream beside the delay levels;
// a [github.com/warrenmq/warren/ledger.Ledger] lists the messages that wait and cancels one
// (its Middleware, in HandlerConfig.Middleware, acks a cancelled message on arrival without
// handling it). A [github.com/warrenmq/warren/scheduler.Scheduler] publishes the ticks of
// recurring jobs (cron expressions, @every) through the delay levels; every process runs one
// with the same group name, and one of them is active:
//
//	s, err := scheduler.New(scheduler.Config{Connection: conn, Name: "billing",
//		Jobs: []scheduler.Job{{Name: "invoices", Schedule: "0 6 1 * *", Topic: "billing.invoices"}}}, logger)
//	err = s.Run(ctx)
//
// warren scheduled list|cancel and warren schedules list show them from a shell.
//
// # Operating
//
// Package [github.com/warrenmq/warren/ops] shows and mends what runs: per work queue its ready
// messages, consumers, remembered kill command and poison queue's depth; the messages waiting
// in the delay levels and parked (with RabbitMQ's management API, queue states too); browsing
// a poison or parking queue without changing it, grouping failures, replaying the messages
// whose cause is fixed (one AMQP transaction per batch: none lost, none twice) and purging.
// The CLI's status, poison and parked commands are built on it:
//
//	o, err := ops.New(ops.Config{Connection: conn}, logger)
//	st, err := o.Status(ctx, "billing")
//	res, err := o.ReplayPoisoned(ctx, "billing", ops.ReplayOptions{})
//
// Package [github.com/warrenmq/warren/ui] shows the same in a browser: an http.Handler that a
// service mounts (under /warren/ in [docs/dashboard.md]), read-only unless
// ui.Config.AllowActions; warren ui serves it there too.
//
// # Tracing
//
// A router traces with OpenTelemetry (router.Config.TracerProvider, by default
// otel.GetTracerProvider()), following the messaging semantic conventions: a producer span
// for every message it publishes (Router.Publisher, handler outputs, retries, poison copies)
// and a consumer span around every message it processes. The trace context travels in the
// message metadata (W3C traceparent), so one trace follows a message from its publish through
// the delay levels and every retry to success or the poison queue. middleware.TraceID(msg)
// gives the trace id for logs. On a bare Watermill router, use middleware.NewTracing:
// Tracing.Middleware and Tracing.Publisher.
//
// # Metrics
//
// A router records metrics with OpenTelemetry's metric API (router.Config.MeterProvider, by
// default otel.GetMeterProvider()): the messaging semantic conventions' messages sent and
// consumed, publish and processing durations, and warren's own retries scheduled, messages
// poisoned, lateness of delayed messages, parked messages and kill events. dlx.Config,
// consumer.Config, middleware.BackoffConfig and middleware.PoisonConfig take a
// MeterProvider of their own. [docs/metrics.md] lists every instrument; go run
// ./examples/metrics serves them for Prometheus.
//
// # Reading more
//
// README.md, at the root of the module, installs warren, shows the smallest program and maps
// the documentation in docs/, one page per task: [docs/connecting.md], [docs/publishing.md]
// (and how the delay levels work), [docs/handlers.md] (and the middleware chain),
// [docs/retries.md], [docs/scheduling.md] (scheduled messages, recurring jobs),
// [docs/rpc.md], [docs/idempotency.md], [docs/kill.md], [docs/topology.md] (and the CLI's
// topology, delays and publish), [docs/operating.md] (status, poison, parked, exit codes),
// [docs/dashboard.md], [docs/metrics.md], [docs/headers.md],
// [docs/clusters.md] (clusters and broker versions), [docs/dead-lettering.md],
// [docs/benchmarks.md], [docs/fault-suite.md] (what warren guarantees and how it is checked)
// and [docs/decisions.md] (decisions and limits, with measurements). CHANGELOG.md lists what
// changed. Each package's documentation details its part; this package, router, dlx,
// topology, middleware, handlers, kill, ops, rpc, scheduler and ui have runnable examples
// (those on the broker use $WARREN_AMQP_URL, else amqp://guest:guest@127.0.0.1:5672/). The
// programs in examples/ show the parts at work, one command each, and import no internal
// package: copy them (the README's Demos lists what each prints): a consumer (go run
// ./examples/consumer), ordinary, delayed and scheduled publishes (go run ./examples/publish
// [-delay 5s | -at TIME]), delays (go run ./examples/delays), retries and then the poison
// queue (go run ./examples/retries), the kill topic across processes (go run
// ./examples/kill), request/reply (go run ./examples/rpc), consumer groups of a topic with a
// trace (go run ./examples/fanout), idempotency with Redis (go run ./examples/idempotency),
// the metrics (go run ./examples/metrics), reminders listed and cancelled (go run
// ./examples/reminders), a recurring job across 3 scheduler processes (go run
// ./examples/scheduler) and the dashboard (go run ./examples/dashboard).
//
// [docs/connecting.md]: https://github.com/warrenmq/warren/blob/main/docs/connecting.md
// [docs/publishing.md]: https://github.com/warrenmq/warren/blob/main/docs/publishing.md
// [docs/handlers.md]: https://github.com/warrenmq/warren/blob/main/docs/handlers.md
// [docs/retries.md]: https://github.com/warrenmq/warren/blob/main/docs/retries.md
// [docs/scheduling.md]: https://github.com/warrenmq/warren/blob/main/docs/scheduling.md
// [docs/dashboard.md]: https://github.com/warrenmq/warren/blob/main/docs/dashboard.md
// [docs/rpc.md]: https://github.com/warrenmq/warren/blob/main/docs/rpc.md
// [docs/idempotency.md]: https://github.com/warrenmq/warren/blob/main/docs/idempotency.md
// [docs/kill.md]: https://github.com/warrenmq/warren/blob/main/docs/kill.md
// [docs/topology.md]: https://github.com/warrenmq/warren/blob/main/docs/topology.md
// [docs/operating.md]: https://github.com/warrenmq/warren/blob/main/docs/operating.md
// [docs/metrics.md]: https://github.com/warrenmq/warren/blob/main/docs/metrics.md
// [docs/headers.md]: https://github.com/warrenmq/warren/blob/main/docs/headers.md
// [docs/clusters.md]: https://github.com/warrenmq/warren/blob/main/docs/clusters.md
// [docs/dead-lettering.md]: https://github.com/warrenmq/warren/blob/main/docs/dead-lettering.md
// [docs/benchmarks.md]: https://github.com/warrenmq/warren/blob/main/docs/benchmarks.md
// [docs/fault-suite.md]: https://github.com/warrenmq/warren/blob/main/docs/fault-suite.md
// [docs/decisions.md]: https://github.com/warrenmq/warren/blob/main/docs/decisions.md
package warren
