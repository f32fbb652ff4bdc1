// Package kill is the sending side of warren's kill switch: a Killer stops every consumer of
// a work queue, in every process, resumes them, or has them drain the queue and delete it.
// The consumers' side, what a subscription does about a command, is consumer.Subscriber's.
//
//	k, err := kill.NewKiller(kill.Config{Connection: conn, Secret: secret}, logger)
//	err = k.Kill(ctx, "billing", kill.Stop) // or kill.Delete: drain the queue, then delete it
//	err = k.Resume(ctx, "billing")
//	res, err := k.Send(ctx, "billing", kill.Stop) // with Config.Wait: the consumers' confirmations
//
// A command (Command: queue, Action, time, signatures) travels as JSON through three names
// of a work queue Q, and a fourth counts who hears it:
//
//   - topology.KillExchange(Q), "Q.kill": a fanout exchange, declared with Q by topology.
//     Every consumer of Q binds an exclusive queue of its own to it, so a command published
//     there reaches every one of them.
//   - StateQueue(Q, secret), "Q.kill.state" (with a secret, followed by an HMAC of Q): a
//     durable quorum queue that holds the last command sent. A Killer writes it before it
//     publishes the command; a consumer that starts reads it, and obeys; ReadState tells an
//     operator what it holds.
//   - LockQueue(Q), "Q.kill.lock": an auto-deleted queue whose exclusive consumer holds the
//     state while it is read or written, so that a reader never misses a command written
//     meanwhile.
//   - ListenerQueue(Q), "Q.kill.listeners": an auto-deleted queue that takes no message, on
//     which every listening consumer, stopped or not, holds a consumer. With Config.Wait, Send
//     counts its consumers, and the work queue's, and stops waiting once that many have
//     answered.
//
// With a secret, a Killer signs each command (Command.Sign) and its reply address
// (Command.SignReply), and counts only confirmations signed with it (Answer.Sign);
// consumers with the secret obey only what Command.Verify accepts. Without one, anyone
// allowed to publish to Q.kill can stop Q's consumers.
//
// Every publish a Killer makes is confirmed by the broker, and mandatory: a command that no
// consumer heard is reported (ErrNoListener), and remembered all the same; a command for a
// queue that does not exist fails with ErrNoQueue, and declares nothing, unless
// Config.Force.
package kill
