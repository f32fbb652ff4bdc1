// Package middleware holds warren's handler middleware, each a plain Watermill
// message.HandlerMiddleware that works on a bare Watermill router too: RetryCount (the
// attempt number, from warren's own header), Tracing (OpenTelemetry, messaging semantic
// conventions, the trace carried in the metadata), Poison (what is given up on goes to the
// queue's poison queue, with the reason), Backoff (a failure is published again, to the queue
// that failed, with the delay of its attempt), Recoverer (a panic becomes an error) and
// Idempotent (a key handled at most once, in a store the processes may share: see
// MemoryStore and the redisstore package).
//
// router.Router chains them around every handler, with an Idempotent keyed by CopyKey
// outermost when router.Config.CopyStore is set; an Idempotent keyed by MessageIDKey, or by a
// key of the user's own, goes in router.HandlerConfig.Middleware, innermost (see Idempotent
// for what each place means). The order of the chain, and why each middleware sits where it
// does, is in [docs/handlers.md]; retry schedules and the poison headers in
// [docs/retries.md]; which headers are a delivery's bookkeeping (IsBookkeeping) in
// [docs/headers.md].
//
// [docs/handlers.md]: https://github.com/warrenmq/warren/blob/main/docs/handlers.md
// [docs/retries.md]: https://github.com/warrenmq/warren/blob/main/docs/retries.md
// [docs/headers.md]: https://github.com/warrenmq/warren/blob/main/docs/headers.md
package middleware
