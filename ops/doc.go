// Package ops is warren's operations API over the broker: what the warren CLI shows and does,
// and what a web page or a script can call alike.
//
//   - Status: per work queue, its ready messages and consumers, its remembered kill command and
//     its poison queue's depth; the messages waiting in the delay levels (per level) and in the
//     parking queue; the broker's version and, where one malformed message can stop its
//     dead-lettering, a warning. With RabbitMQ's management HTTP API (Config.Management), also
//     queue states (a queue or level that is down shows as such, not as empty),
//     unacknowledged and dead-lettering messages and consumers' hosts, and the broker's health
//     (Status.Broker: the nodes' resources and alarms, the policies that change warren's
//     queues); WorkQueues lists warren's work queues. Status.Problems lists what is wrong, a
//     line each. CheckFileHandles says what declaring quorum queues would take of a RabbitMQ
//     3.x node's file handles.
//   - Poisoned and Parked browse the poison queue of a work queue and the parking queue of the
//     delay levels, and Group sorts failures by handler, error type and normalised error.
//   - ReplayPoisoned and ReplayParked send messages back to where they were going (or
//     elsewhere), PurgePoisoned empties a poison queue and DeletePoisoned deletes what a filter
//     selects from it.
//
// # Browsing
//
// AMQP 0-9-1 cannot read a message without taking it, so Poisoned and Parked take the messages
// through consumers (one per 65,535, the largest prefetch count), hold them unacknowledged, and
// hand all of them back at the end with one basic.nack (requeue, multiple). Measured on RabbitMQ
// 3.10.8 and 4.0.5, classic and quorum: the queue is left in the same order, with the same
// messages, bodies and headers. The broker marks them redelivered and, on a quorum queue, raises
// their x-delivery-count; that counts towards no limit, because warren declares poison and
// parking queues with a delivery limit of 2³¹-1 (see topology), and a replay strips the header.
// While a browse holds them, the messages are invisible to other readers (another browse or
// replay waits for them or sees fewer); should the browsing process die, the broker hands them
// back itself. Browse.Scan reads the head of the queue alone: faster on a long queue, but a
// quorum queue on RabbitMQ 3.x puts what it hands back at its tail.
//
// # Replaying
//
// A replay takes messages the same way (all of them) and, for each that matches, publishes a
// copy to its destination and acknowledges the original in one AMQP transaction (tx.select),
// committed every Batch messages. The broker answers a commit once it has the publishes; a connection
// lost before that discards both the publishes and the acks, and the originals stay. The
// acks, though, may still be in flight when the answer comes: measured on RabbitMQ 4.0.5, a
// connection dropped right after a commit handed some of its originals back. So a replay
// remembers the messages it replayed (by warren's publish id, else by id, body and headers)
// and, finding one again after reconnecting, removes it without sending it twice. A replay
// that is interrupted for good (a killed process) is resumed by running it again; only the
// messages of its last transaction can then be sent a second time, if their acks had not
// been applied, and they keep their message id for an idempotent consumer to recognise.
//
// Before each commit the destinations are checked to exist. RabbitMQ routes a transaction's
// publishes only at commit, so a destination deleted in between returns the message after
// its original was acknowledged: the replay then puts the original back into the queue it
// came from (at its tail) and reports it as failed. Only a crash of the replaying process in
// that moment could lose it.
//
// A replayed message keeps its body, properties and headers but loses what its failure
// added: the poison headers, the attempt counter and first-failure time (so its handler has
// every attempt again), the broker's dead-lettering headers and delivery count, and warren's
// transport headers. It gains warren_replays, the number of times it was replayed, and a new
// publish id (warren's subscriber recognises copies of one publish by it). Its expiration,
// which the poison copy kept in warren.PoisonExpirationKey so as not to expire in the
// poison queue, is its property again; a user-id property (of a message the broker
// dead-lettered itself) becomes the header warren.MetadataUserID, since the broker refuses
// another user's id (see warren.Marshaler).
package ops
