// Package middleware holds warren's handler middleware, each a plain Watermill
// message.HandlerMiddleware that works on a bare Watermill router too: RetryCount (the
// attempt number, from warren's own header), Tracing (OpenTelemetry, messaging semantic
// conventions, the trace carried in the metadata), Poison (what is given up on goes to the
// queue's poison queue, with the reason), Backoff (a failure is published again, to the queue
// that failed, with the delay of its attempt), Recoverer (a panic becomes an error) and
// Idempotent (a key handled at most once, in a store the processes may share: see
// MemoryStore and the redisstore package).
//
// router.Router chains them in this order, outermost first: Idempotent keyed by CopyKey
// (only with router.Config.CopyStore), RetryCount, Tracing, Poison, Backoff, then the
// publishing of the handler's outputs, Recoverer and the handler's own middleware
// (router.HandlerConfig.Middleware), where an Idempotent keyed by MessageIDKey, or by a key
// of the user's own, goes: see Idempotent for what each place means.
package middleware
