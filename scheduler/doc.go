// Package scheduler publishes messages on a schedule (cron expressions and @every, in a
// time zone) with one active scheduler among any number of processes, and no database: a
// single-active-consumer queue is the lock, the group's state is a message in a queue, and
// each job's next tick waits in the delay levels until it is due.
//
// Every process of a service runs a Scheduler with the same Config.Name (the group) and
// jobs; one of them is active and publishes, the others stand by and take over within
// milliseconds of the active one's connection ending. Each tick's message id is derived from
// the group, the job and the tick's time (TickID): the rare tick published twice (a
// scheduler killed between publishing it and recording it) is one id, which
// middleware.Idempotent with MessageIDKey handles once. See docs/scheduling.md.
package scheduler
