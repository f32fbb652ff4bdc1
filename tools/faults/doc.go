// Package faults is warren's fault suite: `make faults` runs it (go test -tags faults).
//
// Each case starts a throwaway RabbitMQ node of its own (testenv.StartNode) and two consumer
// processes (the test binary started again as a child, running a warren router with the
// default configuration and a CopyStore in Redis that the two share), and publishes a stream of messages through warren's DLX publisher
// at a steady rate, some delayed, 5% failing their first attempt and 1% failing always,
// while a fault happens: the broker is killed with SIGKILL and restarted, every connection is
// closed 20 times, a consumer process is killed with SIGKILL, or messages that the client
// library cannot parse are injected into the work queue. It then waits until nothing moves,
// counts where every published message ended (processed, poisoned, or lost), prints one
// machine-readable line per case and fails when a message was lost, a queue stopped flowing,
// a handler was called more than MaxAttempts+1 times for one message, processing did not
// resume within 2 s of the fault, or duplicates exceed the messages in flight at the faults.
//
// The package sits in tools/, a module of its own that the root module's `go test ./...` does
// not reach, and its tests are behind the build tag "faults" so that `go test ./...` in tools/
// does not run them either. The cluster cases (`make cluster`, build tag "cluster") run the
// same stream on a 3-node cluster (testenv.StartCluster) and kill the work queue's leader, the
// consumers' node or the publisher's node; the publisher's node once leading the delay levels
// and once the work queue, the consumers' node once leading the delay levels.
//
// The outbox cases run transactions that publish through the outbox (one in ten rolled back),
// relay processes and consumer processes writing their effects in the inbox's transaction,
// and kill a relay, a consumer or the broker, or stop PostgreSQL (a server of the case's own,
// testenv.StartPostgres) fast and immediately and start it again; they count in the database
// the committed events without an effect, the effects of rolled-back ones and the effects
// done twice.
//
// The ordered case publishes 1,000 keys × 20 messages into a queue ordered by key (8 lanes)
// shared by 3 processes, kills the busiest process twice and the broker once, and
// counts, beside losses, the messages of a key that succeeded after a later one of the same key
// (by the time each consumer process took as its handler succeeded) and the duplicates.
//
// docs/fault-suite.md explains each field of the printed lines and gives measured runs.
package faults
