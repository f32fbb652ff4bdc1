// Package topology declares what warren runs on: exchanges of the four types with their
// bindings, durable work queues with a poison queue and a kill exchange each, and the delay
// levels that the dlx publisher routes delayed messages through.
//
// A Topology is a plain description; a Builder declares it (Declare, Apply), idempotently,
// or only checks it (Verify). An exchange or queue that exists with other arguments gives a
// *MismatchError naming it, the argument and what to do, not a bare PRECONDITION_FAILED. A
// Builder is also a watermill-amqp TopologyBuilder, so watermill-amqp's Subscriber (and
// warren's) creates the queues it reads from the same way.
//
// # Topology files
//
// A File is a Config and a Topology in YAML or JSON (Load, Parse): the same model, with
// snake_case keys, so that operators declare, verify and draw what services declare in Go
// (`warren topology apply|verify|diagram FILE`). Unknown keys are errors, and a file is
// validated as NewBuilder and Declare validate. Mermaid and DOT draw a topology with its
// delay levels, poison queues and kill exchanges.
//
// # Quorum by default
//
// Every queue warren declares is a quorum queue unless told otherwise: work queues, poison
// queues, delay level queues and the parking queue. Messages that move from one queue to
// another (a delay level to the next, a work queue to its poison queue) are dead-lettered
// at least once (x-dead-letter-strategy at-least-once, with x-overflow reject-publish, which
// it needs), and a work queue has an explicit delivery limit, the only thing that ends a
// message the client cannot even parse. Config{QueueType: Classic} switches all of them to
// classic queues; Queue.Type and Delay.QueueType override it for one queue or for the
// levels. Classic gives up what Config.QueueType lists: delayed messages and retries lost
// when the broker crashes (TestDelayedMessagesSurviveBrokerCrash: up to all 400, see
// [docs/decisions.md]), no delivery limit, one node.
//
// # Leader placement
//
// A quorum queue's leader is placed once, when the queue is created: by default on the node
// the declaring connection is connected to (client-local), so one process declaring
// everything puts every leader on one node. Config.LeaderLocator Balanced (Delay.LeaderLocator
// for the levels alone) declares x-queue-leader-locator: balanced on the quorum queues
// warren declares, which places each new leader on the node with the fewest. It is off by
// default: RabbitMQ (3.10.8 and 4.0.5, measured) refuses to declare a queue again with
// another x-queue-leader-locator than it has, including none, so queues that exist would be
// refused. For those, a queue-leader-locator policy or the node setting
// queue_leader_locator = balanced spreads new queues without an argument, and
// `rabbitmq-queues rebalance quorum` moves existing leaders. Classic queues never get it.
//
// # Work queues
//
// Declaring a work queue Q declares:
//   - Q, durable, dead-lettering into Q.poison (a message rejected without requeue, or
//     past the quorum delivery limit, Config.DeliveryLimit, ends there and is never
//     dropped);
//   - Q.poison, durable, of Q's type; quorum, without a delivery limit of its own (it is
//     browsed, never consumed to completion: a limit would drop a message browsed that often);
//   - Q.kill, a fanout exchange for the kill switch;
//   - a binding from the delivery exchange of the delay levels to Q, by the header
//     contract.DestQueueHeader, so that delayed messages can reach Q.
//
// # Delay levels
//
// See Delay. The default layout, radix 16 with a 1 ms unit, has 120 level queues for
// delays up to 2³²-1 ms (49.7 days), RabbitMQ's largest TTL, and a chain of 73 queues in
// front of them for delays up to 10 years (Delay.Reach); [docs/decisions.md] explains the
// choice with measurements, and [docs/publishing.md] shows how a message goes through the
// levels.
// Every level exchange, and the delivery exchange, has an alternate exchange into the
// parking queue: a message is parked, never dropped, when it has a missing or bad digit or
// its destination is gone.
//
// # Moving from classic to quorum
//
// The delay levels need nothing: the queue type is part of their names
// (warren.delay.quorum.1ms.r16.*, or warren.delay.classic.1ms.r16.* with the classic switch),
// so levels of another type are declared next to those in use, and levels named without a
// type (warren.delay.1ms.r16.*) are never declared. Messages waiting in levels that are no
// longer declared keep going through them into their own delivery exchange, and from there
// to their work queues, which stay bound to it while they exist. Once those levels are empty
// (after the longest delay that was pending: `rabbitmqctl list_queues name messages | grep
// '^warren\.delay\.1ms\.'`), delete them and their exchanges.
//
// An existing classic work queue cannot become a quorum queue: declaring it again gives a
// *MismatchError naming argument x-queue-type (Existing: classic) and what to do. Either keep
// it classic (Queue.Type: Classic for that queue, or Config.QueueType: Classic for all; the
// levels can still be quorum with Delay.QueueType: Quorum), or drain and delete it
// (`warren kill Q --delete`, run with the classic declarations) and let warren declare it
// again, as a quorum queue. A quorum poison queue that exists with another delivery limit
// than warren's (2³¹-1) is refused too (argument x-delivery-limit): move its messages
// elsewhere, delete it and let warren declare it again. [docs/topology.md] has the details.
//
// [docs/decisions.md]: https://github.com/warrenmq/warren/blob/main/docs/decisions.md
// [docs/publishing.md]: https://github.com/warrenmq/warren/blob/main/docs/publishing.md
// [docs/topology.md]: https://github.com/warrenmq/warren/blob/main/docs/topology.md
package topology
