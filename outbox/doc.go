// Package outbox publishes messages from inside a PostgreSQL transaction: they reach the
// broker if and only if the transaction commits (the transactional outbox), through pgx.
//
// Outbox.Publish writes the messages as rows of the outbox table, in the caller's
// transaction; a Relay moves the committed rows to RabbitMQ through a dlx.Publisher (so
// with publisher confirms, delays, DeliverAt years ahead, schedule ids, routing and AMQP
// properties as for a direct publish), in the order they were written, and deletes each row
// once the broker has confirmed its message. Relays are woken by the commit (LISTEN/NOTIFY)
// and poll as a fallback; several may run, one of them publishing at a time.
//
//	box, err := outbox.New(outbox.Config{}, logger)
//	err = box.Migrate(ctx, pool) // once, or `warren outbox migrate`
//
//	tx, err := pool.Begin(ctx)
//	_, err = tx.Exec(ctx, "INSERT INTO orders ...")
//	err = box.Publish(ctx, tx, "billing", message.NewMessage(watermill.NewUUID(), payload))
//	err = tx.Commit(ctx) // the message goes if and only if this commits
//
//	relay, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: publisher}, logger)
//	go relay.Run(ctx)
//
// What is guaranteed: a committed message is published at least once, and every copy (a
// relay killed between the broker's confirm and its delete sends the rows again) carries
// the same publish id (contract.PublishIDHeader), which warren's subscriber recognises; a
// rolled-back one never is. A row the broker will never take is set aside with the reason
// and holds up nothing behind it.
//
// An Inbox runs a handler in a transaction that also records its message's key: a copy or
// redelivery of a message that took effect is acked without running the handler again, and
// what the handler returns goes through the outbox in the same transaction. See
// [docs/outbox.md].
//
// [docs/outbox.md]: https://github.com/warrenmq/warren/blob/main/docs/outbox.md
package outbox
