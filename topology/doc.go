// Package topology declares what warren runs on: exchanges of the four types with their
// bindings, durable work queues (classic, or quorum with an explicit delivery limit and
// at-least-once dead-lettering), a poison queue and a kill exchange per work queue, and the
// delay levels that the dlx publisher routes delayed messages through.
//
// A Topology is a plain description; a Builder declares it (Declare, Apply), idempotently,
// or only checks it (Verify). An exchange or queue that exists with other arguments gives a
// *MismatchError naming it and the argument, not a bare PRECONDITION_FAILED. A Builder is
// also a watermill-amqp TopologyBuilder, so watermill-amqp's Subscriber (and warren's)
// creates the queues it reads from the same way.
//
// # Work queues
//
// Declaring a work queue Q declares:
//   - Q, durable, dead-lettering into Q.poison (a message rejected without requeue, or
//     past the quorum delivery limit, ends there and is never dropped);
//   - Q.poison, durable, of the same type;
//   - Q.kill, a fanout exchange for the kill switch;
//   - a binding from the delivery exchange of the delay levels to Q, by the header
//     HeaderDestQueue, so that delayed messages can reach Q.
//
// # Delay levels
//
// See Delay. The default layout, radix 16 with a 1 ms unit, has 120 queues and holds
// delays up to 2³²-1 ms (49.7 days); the README explains the choice with measurements.
package topology
