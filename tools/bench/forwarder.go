package main

import (
	"context"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/components/forwarder"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Watermill's outbox: watermill-sql's PostgreSQL publisher, wrapped by forwarder.NewPublisher,
// writes each message in an envelope into one table in the writer's transaction; a
// Forwarder reads that table with watermill-sql's subscriber and publishes each message to
// its topic with watermill-amqp. Everything is as its documentation sets it up
// (DefaultPostgreSQLSchema and DefaultPostgreSQLOffsetsAdapter, the subscriber's and the
// Forwarder's defaults) but for the names of its tables, which go into a schema of their own,
// and the publisher's ConfirmDelivery, on as warren always confirms.
type watermillOutbox struct {
	pool    *pgxpool.Pool
	schema  string
	sql     wsql.DefaultPostgreSQLSchema
	offsets wsql.DefaultPostgreSQLOffsetsAdapter
}

func newWatermillOutbox(ctx context.Context, pool *pgxpool.Pool, schema string) (*watermillOutbox, error) {
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		return nil, err
	}
	return &watermillOutbox{
		pool:   pool,
		schema: schema,
		sql: wsql.DefaultPostgreSQLSchema{GenerateMessagesTableName: func(topic string) string {
			return fmt.Sprintf(`%s."watermill_%s"`, schema, topic)
		}},
		offsets: wsql.DefaultPostgreSQLOffsetsAdapter{GenerateMessagesOffsetsTableName: func(topic string) string {
			return fmt.Sprintf(`%s."watermill_offsets_%s"`, schema, topic)
		}},
	}, nil
}

// drop removes the schema and every table in it.
func (w *watermillOutbox) drop(ctx context.Context) {
	if _, err := w.pool.Exec(ctx, "DROP SCHEMA "+w.schema+" CASCADE"); err != nil {
		fmt.Println("bench: dropping the Forwarder's schema:", err)
	}
}

// publisher returns the Forwarder's publisher writing on db (the pool, or one transaction):
// messages published to a topic go, in an envelope, into forwarderTopic's table.
func (w *watermillOutbox) publisher(db wsql.ContextExecutor, forwarderTopic string) (message.Publisher, error) {
	p, err := wsql.NewPublisher(db, wsql.PublisherConfig{SchemaAdapter: w.sql}, watermill.NopLogger{})
	if err != nil {
		return nil, err
	}
	return forwarder.NewPublisher(p, forwarder.PublisherConfig{ForwarderTopic: forwarderTopic}), nil
}

// publishTx writes msgs, enveloped for the Forwarder, in transaction tx.
func (w *watermillOutbox) publishTx(tx pgx.Tx, forwarderTopic, topic string, msgs ...*message.Message) error {
	p, err := w.publisher(wsql.TxFromPgx(tx), forwarderTopic)
	if err != nil {
		return err
	}
	return p.Publish(topic, msgs...)
}

// init creates forwarderTopic's tables, as the subscriber does with InitializeSchema.
func (w *watermillOutbox) init(forwarderTopic string) error {
	sub, err := w.subscriber()
	if err != nil {
		return err
	}
	defer sub.Close()
	return sub.SubscribeInitialize(forwarderTopic)
}

func (w *watermillOutbox) subscriber() (*wsql.Subscriber, error) {
	return wsql.NewSubscriber(wsql.BeginnerFromPgx(w.pool), wsql.SubscriberConfig{
		SchemaAdapter:    w.sql,
		OffsetsAdapter:   w.offsets,
		InitializeSchema: true,
	}, watermill.NopLogger{})
}

// forwarder returns a Forwarder reading forwarderTopic's table and publishing to out.
func (w *watermillOutbox) forwarder(forwarderTopic string, out message.Publisher) (*forwarder.Forwarder, *wsql.Subscriber, error) {
	sub, err := w.subscriber()
	if err != nil {
		return nil, nil, err
	}
	f, err := forwarder.NewForwarder(sub, out, watermill.NopLogger{}, forwarder.Config{ForwarderTopic: forwarderTopic})
	if err != nil {
		_ = sub.Close()
		return nil, nil, err
	}
	return f, sub, nil
}

// watermillAMQPPublisher returns watermill-amqp's publisher of durable queues, confirming
// every message, with -forwarder-channel-pool channels (by default none: each Publish opens
// a channel, puts it in confirm mode, publishes, waits for the confirm and closes it), after
// declaring q as warren declares its work queues (outside the timing).
func watermillAMQPPublisher(q string) (*wamqp.Publisher, error) {
	if err := declareQueue(q); err != nil {
		return nil, err
	}
	cfg := wamqp.NewDurableQueueConfig(firstNode())
	cfg.Publish.ConfirmDelivery = true
	cfg.Publish.ChannelPoolSize = *fwdPool
	return wamqp.NewPublisher(cfg, watermill.NopLogger{})
}

// forwarderRun writes n messages for topic q into a table of their own (outside the timing),
// as relayRun writes warren's outbox, then times one Forwarder moving them to the broker
// until it has recorded the last one as done.
func forwarderRun(w *watermillOutbox, q string, body []byte) (time.Duration, error) {
	ctx := context.Background()
	topic := q // the Forwarder's table: one per run
	if err := w.init(topic); err != nil {
		return 0, err
	}
	in, err := w.publisher(wsql.BeginnerFromPgx(w.pool), topic)
	if err != nil {
		return 0, err
	}
	for written := 0; written < *outboxN; written += 1000 {
		msgs := make([]*message.Message, min(1000, *outboxN-written))
		for i := range msgs {
			msgs[i] = message.NewMessage(watermill.NewUUID(), body)
		}
		if err := in.Publish(q, msgs...); err != nil {
			return 0, err
		}
	}
	out, err := watermillAMQPPublisher(q)
	if err != nil {
		return 0, err
	}
	defer out.Close()
	f, sub, err := w.forwarder(topic, out)
	if err != nil {
		return 0, err
	}
	defer sub.Close()
	done := make(chan error, 1)
	last := `SELECT EXISTS (SELECT 1 FROM ` + w.offsets.MessagesOffsetsTable(topic) +
		` WHERE offset_acked = (SELECT max("offset") FROM ` + w.sql.MessagesTable(topic) + `))`
	s := startSpan()
	go func() { done <- f.Run(ctx) }()
	for { // a cheap look, every 5 ms, for the last row's offset to be recorded
		var all bool
		if err := w.pool.QueryRow(ctx, last).Scan(&all); err != nil {
			_ = f.Close()
			return 0, err
		}
		if all {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	d := s.stop()
	if err := f.Close(); err != nil {
		return 0, err
	}
	return d, <-done
}
