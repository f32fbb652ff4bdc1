// Package ui is warren's dashboard: an http.Handler that a service mounts under any path (or
// that `warren ui` serves) to see and operate what warren puts on the broker, through ops.
//
//   - Overview: one line that names what is wrong (ops.Status.Problems: poison waiting, no
//     consumer, killed, missing or down queues, delay levels, parked messages, the broker's
//     alarms and its version's hazard), the rows at fault marked; every work queue (ready,
//     unacknowledged, consumers, kill state, poison depth) and the delay levels (waiting, when
//     they come due at the latest, parked), with their depths and changes per minute over the
//     last hour, sampled in the process. A broker that cannot be read shows the error and the
//     last values read. With Config.Outbox, the outbox on PostgreSQL (package outbox): rows
//     waiting, the oldest one's age, relays, rows set aside, inbox keys.
//   - Outbox: the rows set aside, with the broker's reason, each replayed from its form, or
//     all of them once confirmed.
//   - Poison and parked: failure groups, a filter (group, reason, handler, error text, a
//     header, a time window) applied on the server, one page of the messages it selects, and
//     each message's detail: its attempts, headers and body (indented JSON, text, or hex).
//   - Actions: replay or delete what a filter selects (a count first, then a confirmation,
//     then a job whose progress the page follows), kill and resume a queue with the
//     consumers' confirmations.
//
// # Safe by default
//
// The Handler is read-only unless Config.AllowActions: every action is refused on the
// server. An action also needs a CSRF token (a signed double-submit cookie), a request of the
// same origin (http.CrossOriginProtection) and Config.Authorize's consent, and writes an audit
// log line (who, what, which queue, how many) when it starts and when it ends. Config.Redact
// redacts every message once, when it is read: the pages, groups, filters and counts see
// only what it leaves. Config.Authorize is asked first, with ActionView, for every request.
// Everything read from the broker is written out visibly in every part of a page (control
// characters and bytes that are not UTF-8 as \x1b, \xff) and escaped by html/template; a
// form field whose value a browser would change (NUL, controls, bytes that are not UTF-8)
// carries the value's bytes in base64url, so that every id is acted on by its exact bytes.
// Pages load no script or style but their own (Content-Security-Policy 'self'): htmx,
// vendored, refreshes the overview and a job's progress.
//
// # Large queues
//
// AMQP 0-9-1 reads a queue by taking its messages (see ops): a poison or parked page reads
// the first Config.ScanLimit messages, says how many of how many it read, and reuses them for
// Config.SnapshotAge. On RabbitMQ 3.x a quorum queue puts the messages read back at its tail
// (see ops.Browse.Scan). Replays, deletes and their counts read the whole queue, the counts
// within Config.CountTimeout. One reader at a time takes a queue's messages: pages that ask
// at once share one read, and while a replay or delete runs on a queue its pages are refused.
// docs/dashboard.md has the measured times.
package ui
