package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/outbox"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// setup is one test's outbox: a schema of its own, migrated, and an Outbox writing to it.
type setup struct {
	env    *testenv.Env
	pool   *pgxpool.Pool
	schema string
	box    *outbox.Outbox
}

func newSetup(t *testing.T) *setup {
	t.Helper()
	env := testenv.New(t)
	pool, schema := testenv.Postgres(t)
	box, err := outbox.New(outbox.Config{Schema: schema}, env.Logger())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience())
	defer cancel()
	require.NoError(t, box.Migrate(ctx, pool))
	return &setup{env: env, pool: pool, schema: schema, box: box}
}

// publisher is a DLX publisher with classic delay levels of the test's own (light on the
// broker: these tests are about the outbox, not the levels) that declares the work queue q
// when it starts.
func (s *setup) publisher(t *testing.T, q string, mod func(*dlx.Config)) *dlx.Publisher {
	t.Helper()
	cfg := dlx.Config{Connection: s.env.Connection(),
		Topology: topology.Config{Delay: s.env.Delay(topology.Delay{QueueType: topology.Classic})},
		Declare:  topology.Topology{Queues: []topology.Queue{{Name: q}}}}
	if mod != nil {
		mod(&cfg)
	}
	p, err := dlx.NewPublisher(cfg, s.env.Logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// publisherWithUnbound is publisher for q that also declares an exchange of the test's own
// bound to nothing, and routes the topic of that name to it: what is published there is
// returned by the broker as unroutable.
func (s *setup) publisherWithUnbound(t *testing.T, q string) (pub *dlx.Publisher, unbound string) {
	t.Helper()
	unbound = s.env.Exchange("unbound")
	pub = s.publisher(t, q, func(c *dlx.Config) {
		c.Declare.Exchanges = append(c.Declare.Exchanges, topology.Exchange{Name: unbound, Kind: "fanout"})
		c.Route = func(topic string) dlx.Route {
			if topic == unbound {
				return dlx.Route{Exchange: unbound, Declared: true}
			}
			return dlx.ToQueue(topic)
		}
	})
	return pub, unbound
}

// relay runs a relay of the test's outbox through pub until the test ends or stop is called.
func (s *setup) relay(t *testing.T, pub message.Publisher, mod func(*outbox.RelayConfig)) (stop func()) {
	t.Helper()
	cfg := outbox.RelayConfig{Pool: s.pool, Publisher: pub, Schema: s.schema, PollInterval: 100 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	r, err := outbox.NewRelay(cfg, s.env.Logger())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			assert.NoError(t, <-done)
		})
	}
	t.Cleanup(stop)
	return stop
}

// writeCtx writes msgs to topic in one transaction with ctx (its trace), committed.
func (s *setup) writeCtx(ctx context.Context, t *testing.T, topic string, msgs ...*message.Message) {
	t.Helper()
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, s.box.Publish(ctx, tx, topic, msgs...))
	require.NoError(t, tx.Commit(ctx))
}

// write writes msgs to topic in one transaction, committed or rolled back.
func (s *setup) write(t *testing.T, commit bool, topic string, msgs ...*message.Message) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience())
	defer cancel()
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, s.box.Publish(ctx, tx, topic, msgs...))
	if commit {
		require.NoError(t, tx.Commit(ctx))
	} else {
		require.NoError(t, tx.Rollback(ctx))
	}
}

// rows counts the outbox's rows: waiting, and set aside.
func (s *setup) rows(t *testing.T) (waiting, setAside int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience())
	defer cancel()
	require.NoError(t, s.pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE set_aside IS NULL), count(*) FILTER (WHERE set_aside IS NOT NULL) FROM "+
		pgx.Identifier{s.schema, "outbox"}.Sanitize()).Scan(&waiting, &setAside))
	return waiting, setAside
}

type arrival struct {
	msg *message.Message
	d   amqp.Delivery
	at  time.Time
}

// consume reads queue until n messages arrived (failing the test after testenv.Patience),
// then for quiet more, and returns all it got.
func consume(t *testing.T, env *testenv.Env, queue string, n int, quiet time.Duration) []arrival {
	t.Helper()
	ch := env.Channel()
	defer ch.Close()
	deliveries, err := ch.Consume(queue, "", true, false, false, false, nil)
	require.NoError(t, err)
	var got []arrival
	deadline := time.After(testenv.Patience())
	for len(got) < n {
		select {
		case d := <-deliveries:
			msg, err := warren.Marshaler{}.Unmarshal(d)
			require.NoError(t, err)
			got = append(got, arrival{msg, d, time.Now()})
		case <-deadline:
			t.Fatalf("queue %s: %d of %d messages arrived within %s", queue, len(got), n, testenv.Patience())
		}
	}
	for end := time.After(quiet); ; {
		select {
		case d := <-deliveries:
			msg, err := warren.Marshaler{}.Unmarshal(d)
			require.NoError(t, err)
			got = append(got, arrival{msg, d, time.Now()})
		case <-end:
			return got
		}
	}
}

func uuids(got []arrival) []string {
	var ids []string
	for _, a := range got {
		ids = append(ids, a.msg.UUID)
	}
	return ids
}

// What a committed transaction wrote arrives, once and in the order written, with every
// byte of its UUID, payload and metadata; what a rolled-back one wrote never does; the
// relay deletes what the broker confirmed.
func TestCommittedArriveInOrderRolledBackNever(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	q := s.env.Queue("orders")
	s.relay(t, s.publisher(t, q, nil), nil)

	odd := "\x00\xff\x1b[2J é"
	var want []string
	var msgs []*message.Message
	for _, id := range []string{"a", "b" + odd, "c", "d", "e"} {
		msg := message.NewMessage(id, []byte("payload "+id+odd))
		msg.Metadata.Set("tenant", "acme"+odd)
		msg.Metadata.Set(warren.MetadataContentType, "text/plain")
		msgs = append(msgs, msg)
		want = append(want, id)
	}
	s.write(t, false, q, message.NewMessage("rolled-back-1", nil), message.NewMessage("rolled-back-2", nil))
	s.write(t, true, q, msgs...)
	s.write(t, false, q, message.NewMessage("rolled-back-3", nil))

	got := consume(t, s.env, q, len(want), time.Second)
	assert.Equal(t, want, uuids(got), "the committed messages, in order, each once")
	for i, a := range got {
		assert.Equal(t, "payload "+want[i]+odd, string(a.msg.Payload))
		assert.Equal(t, "acme"+odd, a.msg.Metadata.Get("tenant"))
		assert.Equal(t, "text/plain", a.d.ContentType)
		assert.NotEmpty(t, a.d.Headers[contract.PublishIDHeader])
	}
	require.Eventually(t, func() bool { w, a := s.rows(t); return w == 0 && a == 0 },
		testenv.Patience(), 50*time.Millisecond, "the relay deletes the rows it published")
}

// A delay counts from the write. A message whose due time passed while no relay ran is
// published at once when one starts (not refused as "in the past").
func TestDelaysCountFromTheWrite(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	q := s.env.Queue("later")
	pub := s.publisher(t, q, nil)

	late := message.NewMessage("due-while-no-relay-ran", nil)
	warren.Delay(late, 10*time.Millisecond)
	s.write(t, true, q, late)
	time.Sleep(1500 * time.Millisecond) // past dlx.DefaultPastTolerance: dlx would refuse a DeliverAt so old

	delayed := message.NewMessage("delayed", nil)
	warren.Delay(delayed, 2*time.Second)
	written := time.Now()
	s.write(t, true, q, delayed)
	s.relay(t, pub, nil)

	got := consume(t, s.env, q, 2, 0)
	assert.Equal(t, []string{"due-while-no-relay-ran", "delayed"}, uuids(got))
	assert.GreaterOrEqual(t, got[1].at.Sub(written), 2*time.Second, "a delayed message is never early")
	_, aside := s.rows(t)
	assert.Zero(t, aside)
}

// A row the broker will never take is set aside with the reason, and the rows behind it go
// on: an unroutable message (a topic of its own) and a message too large for a frame among
// others of the same topic.
func TestWhatTheBrokerNeverTakesIsSetAside(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	q := s.env.Queue("work")
	pub, nowhere := s.publisherWithUnbound(t, q)
	s.relay(t, pub, nil)

	big := message.NewMessage("too-large", nil)
	big.Metadata.Set("big", strings.Repeat("x", 200_000))
	ctx := context.Background()
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, s.box.Publish(ctx, tx, q, message.NewMessage("first", nil)))
	require.NoError(t, s.box.Publish(ctx, tx, nowhere, message.NewMessage("unroutable", nil)))
	require.NoError(t, s.box.Publish(ctx, tx, q, message.NewMessage("second", nil), big, message.NewMessage("third", nil)))
	require.NoError(t, tx.Commit(ctx))

	got := consume(t, s.env, q, 3, time.Second)
	// "second" may come twice: when its batch fails, the relay publishes the batch again one
	// message at a time; the copy carries the same publish id.
	var order []string
	ids := map[string]any{}
	for _, a := range got {
		if len(order) == 0 || order[len(order)-1] != a.msg.UUID {
			order = append(order, a.msg.UUID)
		}
		if prev, ok := ids[a.msg.UUID]; ok {
			assert.Equal(t, prev, a.d.Headers[contract.PublishIDHeader], "a copy has its message's publish id")
		}
		ids[a.msg.UUID] = a.d.Headers[contract.PublishIDHeader]
	}
	assert.Equal(t, []string{"first", "second", "third"}, order)

	var reasons []string
	rows, err := s.pool.Query(ctx, "SELECT convert_from(uuid, 'UTF8') || ': ' || reason FROM "+
		pgx.Identifier{s.schema, "outbox"}.Sanitize()+" WHERE set_aside IS NOT NULL ORDER BY id")
	require.NoError(t, err)
	reasons, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, reasons, 2)
	assert.Contains(t, reasons[0], "unroutable: ")
	assert.Contains(t, reasons[0], "NO_ROUTE")
	assert.Contains(t, reasons[1], "too-large: ")
	assert.Contains(t, reasons[1], warren.ErrTooLarge.Error())
	require.Eventually(t, func() bool { w, _ := s.rows(t); return w == 0 },
		testenv.Patience(), 50*time.Millisecond, "the relay deletes the rows it published")
}

// flaky publishes and then, the first time, says it failed: as a relay that lost its
// connection to the database between the broker's confirm and its delete.
type flaky struct {
	message.Publisher
	failed atomic.Bool
}

func (f *flaky) Publish(topic string, msgs ...*message.Message) error {
	if err := f.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	if f.failed.CompareAndSwap(false, true) {
		return errors.New("lost after the confirm")
	}
	return nil
}

// A row published but not deleted is published again, with the same publish id: the copy
// is recognisable downstream.
func TestACopyHasItsMessagesPublishID(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	q := s.env.Queue("copies")
	s.relay(t, &flaky{Publisher: s.publisher(t, q, nil)}, func(c *outbox.RelayConfig) { c.MaxBackoff = 100 * time.Millisecond })
	s.write(t, true, q, message.NewMessage("one", nil), message.NewMessage("two", nil))

	got := consume(t, s.env, q, 4, time.Second)
	require.Len(t, got, 4)
	assert.Equal(t, []string{"one", "two", "one", "two"}, uuids(got))
	assert.Equal(t, got[0].d.Headers[contract.PublishIDHeader], got[2].d.Headers[contract.PublishIDHeader])
	assert.Equal(t, got[1].d.Headers[contract.PublishIDHeader], got[3].d.Headers[contract.PublishIDHeader])
	assert.NotEqual(t, got[0].d.Headers[contract.PublishIDHeader], got[1].d.Headers[contract.PublishIDHeader])
}

// counting counts the messages a relay published.
type counting struct {
	message.Publisher
	n atomic.Int64
}

func (c *counting) Publish(topic string, msgs ...*message.Message) error {
	c.n.Add(int64(len(msgs)))
	return c.Publisher.Publish(topic, msgs...)
}

// Two relays: one publishes, the other waits; when the first stops, the second takes over.
// Every message arrives once, in order.
func TestOneRelayAtATimeAndATakeover(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	q := s.env.Queue("relays")
	pub := s.publisher(t, q, nil)
	first, second := &counting{Publisher: pub}, &counting{Publisher: pub}
	stopFirst := s.relay(t, first, nil)
	probes := 0
	require.Eventually(t, func() bool { // the first holds the lock before the second starts
		probes++
		s.write(t, true, q, message.NewMessage("probe", nil))
		return first.n.Load() > 0
	}, testenv.Patience(), 200*time.Millisecond)
	s.relay(t, second, nil)

	var want []string
	for i := range 20 {
		id := "m" + string(rune('a'+i))
		want = append(want, id)
		s.write(t, true, q, message.NewMessage(id, nil))
		if i == 9 {
			// Wait until the first ten are published and their rows deleted, then stop the
			// relay that sent them.
			require.Eventually(t, func() bool { w, _ := s.rows(t); return w == 0 }, testenv.Patience(), 20*time.Millisecond)
			stopFirst()
		}
	}
	got := consume(t, s.env, q, probes+20, time.Second)
	var ids []string
	for _, id := range uuids(got) {
		if id != "probe" {
			ids = append(ids, id)
		}
	}
	assert.Equal(t, want, ids)
	assert.Equal(t, int64(probes+10), first.n.Load(), "the first relay published until it stopped")
	assert.Equal(t, int64(10), second.n.Load(), "the second took over")
}

// Migrate may run again, from several processes at once.
func TestMigrateRunsAgainAndAtOnce(t *testing.T) {
	t.Parallel()
	testenv.NeedsBroker(t)
	pool, schema := testenv.Postgres(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience())
			defer cancel()
			errs[i] = outbox.Migrate(ctx, pool, schema)
		})
	}
	wg.Wait()
	for _, err := range errs {
		assert.NoError(t, err)
	}
	assert.NoError(t, outbox.Migrate(context.Background(), pool, schema))
}

func TestConfigErrorsNameTheField(t *testing.T) {
	_, err := outbox.New(outbox.Config{Schema: strings.Repeat("s", 64)}, nil)
	assert.ErrorContains(t, err, "Config.Schema")
	_, err = outbox.New(outbox.Config{PastTolerance: -time.Second}, nil)
	assert.ErrorContains(t, err, "Config.PastTolerance")
	_, err = outbox.NewRelay(outbox.RelayConfig{}, nil)
	assert.ErrorContains(t, err, "RelayConfig.Pool")
	pool := &pgxpool.Pool{}
	_, err = outbox.NewRelay(outbox.RelayConfig{Pool: pool}, nil)
	assert.ErrorContains(t, err, "RelayConfig.Publisher")
	_, err = outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: &counting{}, BatchSize: -1}, nil)
	assert.ErrorContains(t, err, "RelayConfig.BatchSize")
}

// A delay dlx would refuse fails the write, and nothing is written.
func TestABadDelayFailsTheWrite(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	msg := message.NewMessage(watermill.NewUUID(), nil)
	msg.Metadata.Set(warren.MetadataDelay, "soon")
	ctx := context.Background()
	err := s.box.Publish(ctx, s.pool, "q", message.NewMessage("fine", nil), msg)
	assert.ErrorIs(t, err, warren.ErrInvalidDelay)
	waiting, _ := s.rows(t)
	assert.Zero(t, waiting)
}

// A relay on a schema that was never migrated stops with an error that says so, instead of
// trying for ever.
func TestRelayWithoutTheTableSaysMigrate(t *testing.T) {
	t.Parallel()
	testenv.NeedsBroker(t)
	pool, schema := testenv.Postgres(t)
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: pool, Publisher: &counting{}, Schema: schema}, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Patience())
	defer cancel()
	err = r.Run(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "outbox.Migrate")
}

// ReadStats shows what waits and how old it is, what is set aside and the relays; a row set
// aside, once mended (here: its exchange gets a binding), goes out on Replay.
func TestStatsListAndReplay(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	q := s.env.Queue("mended")
	pub, nowhere := s.publisherWithUnbound(t, q)
	ctx := context.Background()

	s.write(t, true, nowhere, message.NewMessage("refused", nil))
	st, err := outbox.ReadStats(ctx, s.pool, s.schema)
	require.NoError(t, err)
	assert.Equal(t, int64(1), st.Waiting)
	assert.Positive(t, st.Oldest)
	assert.Zero(t, st.Relays)
	assert.False(t, st.Leading)

	s.relay(t, pub, nil)
	require.Eventually(t, func() bool { _, aside := s.rows(t); return aside == 1 }, testenv.Patience(), 50*time.Millisecond)
	st, err = outbox.ReadStats(ctx, s.pool, s.schema)
	require.NoError(t, err)
	assert.Equal(t, outbox.Stats{Schema: s.schema, SetAside: 1, Relays: 1, Leading: true, InboxKeys: st.InboxKeys}, st)
	list, err := outbox.ListSetAside(ctx, s.pool, s.schema, 10)
	require.NoError(t, err)
	require.Len(t, list, 1)
	assert.Equal(t, "refused", list[0].UUID)
	assert.Equal(t, nowhere, list[0].Topic)
	assert.Contains(t, list[0].Reason, "NO_ROUTE")

	require.NoError(t, s.env.Channel().QueueBind(q, "", nowhere, false, nil))
	n, err := outbox.Replay(ctx, s.pool, s.schema)
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	got := consume(t, s.env, q, 1, 0)
	assert.Equal(t, []string{"refused"}, uuids(got))
	require.Eventually(t, func() bool { w, a := s.rows(t); return w == 0 && a == 0 }, testenv.Patience(), 50*time.Millisecond)
}

// A database/sql transaction through pgx's stdlib driver writes to the outbox as a pgx one
// does: committed arrives, rolled back never.
func TestPublishThroughDatabaseSQL(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	q := s.env.Queue("sql")
	db := stdlib.OpenDBFromPool(s.pool)
	defer db.Close()
	ctx := context.Background()
	for _, commit := range []bool{false, true} {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		id := "rolled-back"
		if commit {
			id = "committed"
		}
		require.NoError(t, s.box.Publish(ctx, outbox.SQL(tx), q, message.NewMessage(id, []byte{0, 0xff})))
		if commit {
			require.NoError(t, tx.Commit())
		} else {
			require.NoError(t, tx.Rollback())
		}
	}
	s.relay(t, s.publisher(t, q, nil), nil)
	got := consume(t, s.env, q, 1, time.Second)
	assert.Equal(t, []string{"committed"}, uuids(got))
	assert.Equal(t, []byte{0, 0xff}, []byte(got[0].msg.Payload))
}

// The trace of the transaction that wrote a message goes on through the relay's publish: the
// relay's send span (middleware.Tracing's publisher) is a child of the writer's span, and the
// message carries that trace to the consumer.
func TestTheTraceFollowsTheMessage(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	q := s.env.Queue("traced")
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tracing, err := middleware.NewTracing(middleware.TracingConfig{TracerProvider: tp})
	require.NoError(t, err)
	s.relay(t, tracing.Publisher(s.publisher(t, q, nil)), nil)

	ctx, span := tp.Tracer("test").Start(context.Background(), "place order")
	s.writeCtx(ctx, t, q, message.NewMessage("traced", nil))
	span.End()

	got := consume(t, s.env, q, 1, 0)
	carried := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier(got[0].msg.Metadata)))
	assert.Equal(t, span.SpanContext().TraceID(), carried.TraceID(), "the message carries the writer's trace")
	var send sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		for _, sp := range spans.Ended() {
			if sp.Name() == "send "+q {
				send = sp
				return true
			}
		}
		return false
	}, testenv.Patience(), 10*time.Millisecond)
	assert.Equal(t, span.SpanContext().SpanID(), send.Parent().SpanID(), "the relay's send span is a child of the writer's")
	assert.Equal(t, send.SpanContext().SpanID(), carried.SpanID(), "the consumer continues from the send span")
}

// The relay's metrics count what it did: three messages relayed (each with its lag from the
// write), one row set aside.
func TestRelayMetrics(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	q := s.env.Queue("metered")
	pub, nowhere := s.publisherWithUnbound(t, q)
	reader := sdkmetric.NewManualReader()
	// Not shut down: a condition of Never may still collect after Never returned.
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	s.relay(t, pub, func(c *outbox.RelayConfig) { c.MeterProvider = mp })
	s.write(t, true, q, message.NewMessage("a", nil), message.NewMessage("b", nil), message.NewMessage("c", nil))
	s.write(t, true, nowhere, message.NewMessage("refused", nil))
	// The relay records its metrics just after its delete and update: read them until they
	// are in.
	collect := func() map[string]float64 {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			return map[string]float64{"collect failed: " + err.Error(): 1}
		}
		got := map[string]float64{}
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				switch data := m.Data.(type) {
				case metricdata.Sum[int64]:
					for _, p := range data.DataPoints {
						v, _ := p.Attributes.Value("warren.outbox.schema")
						assert.Equal(t, s.schema, v.AsString())
						got[m.Name] += float64(p.Value)
					}
				case metricdata.Histogram[float64]:
					for _, p := range data.DataPoints {
						got[m.Name] += float64(p.Count)
					}
				}
			}
		}
		return got
	}
	want := map[string]float64{"warren.outbox.relayed": 3, "warren.outbox.set_aside": 1, "warren.outbox.lag": 3}
	require.Eventually(t, func() bool { return assert.ObjectsAreEqual(want, collect()) }, testenv.Patience(), 20*time.Millisecond)
	assert.Never(t, func() bool { return !assert.ObjectsAreEqual(want, collect()) }, 300*time.Millisecond, 20*time.Millisecond,
		"nothing counted twice")
}

// failing is a publisher that fails every call with the error it holds.
type failing struct{ err atomic.Pointer[error] }

func (f *failing) Publish(string, ...*message.Message) error { return *f.err.Load() }
func (f *failing) Close() error                              { return nil }

// logged records the messages logged at error and info level, and the errors.
type logged struct {
	mu     sync.Mutex
	errors []string
	infos  []string
	errs   []error
}

func (l *logged) Error(msg string, err error, _ watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errors, l.errs = append(l.errors, msg), append(l.errs, err)
}

func (l *logged) Info(msg string, _ watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.infos = append(l.infos, msg)
}

func (l *logged) Debug(string, watermill.LogFields)                {}
func (l *logged) Trace(string, watermill.LogFields)                {}
func (l *logged) With(watermill.LogFields) watermill.LoggerAdapter { return l }

// count returns how many times msg was logged at error and at info level, and the last error.
func (l *logged) count(msg string) (errors, infos int, last error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, m := range l.errors {
		if m == msg {
			errors, last = errors+1, l.errs[i]
		}
	}
	for _, m := range l.infos {
		if m == msg {
			infos++
		}
	}
	return errors, infos, last
}

// A failure that repeats is logged once as an error and then, once per try, at info level
// with a count; a different failure is an error again.
func TestARepeatedFailureIsLoggedOnce(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	s.write(t, true, s.env.Queue("never"), message.NewMessage("waits", nil))
	logger := &logged{}
	pub := &failing{}
	away := errors.New("the broker is away")
	pub.err.Store(&away)
	r, err := outbox.NewRelay(outbox.RelayConfig{Pool: s.pool, Publisher: pub, Schema: s.schema,
		MaxBackoff: 50 * time.Millisecond}, logger)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); assert.NoError(t, <-done) }()

	const failed, still = "outbox: relay failed, trying again", "outbox: relay still failing, trying again"
	require.Eventually(t, func() bool { _, n, _ := logger.count(still); return n >= 3 },
		testenv.Patience(), 10*time.Millisecond, "the same failure, tried again")
	n, _, last := logger.count(failed)
	assert.Equal(t, 1, n, "the first failure is an error, its repeats are not")
	assert.ErrorIs(t, last, away)

	other := errors.New("the broker refuses")
	pub.err.Store(&other)
	require.Eventually(t, func() bool { n, _, _ := logger.count(failed); return n == 2 },
		testenv.Patience(), 10*time.Millisecond, "a different failure is an error again")
	_, _, last = logger.count(failed)
	assert.ErrorIs(t, last, other)
}

// The relay keeps each key's order into a queue ordered by key: its publisher routes every row
// by its key to its lane, rows in the order written; a row without a key is set aside with
// the reason.
func TestTheRelayKeepsEachKeysOrder(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	q := s.env.Queue("ordered")
	const lanes, keys, seqs = 4, 5, 10
	names := []string{topology.HeldState(q), router.MembersQueue(q)}
	for i := range lanes {
		names = append(names, topology.LaneQueue(q, i), topology.HeldQueue(q, i))
	}
	s.env.Remove(names, nil)
	top := topology.Topology{Queues: []topology.Queue{{Name: q, Lanes: lanes}}}
	s.relay(t, s.publisher(t, q, func(c *dlx.Config) { c.Declare = top }), nil)
	for seq := range seqs {
		var msgs []*message.Message
		for k := range keys {
			msg := message.NewMessage(fmt.Sprintf("k%d/%d", k, seq), nil)
			warren.OrderBy(msg, fmt.Sprintf("k%d", k))
			msgs = append(msgs, msg)
		}
		if seq == 3 {
			msgs = append(msgs, message.NewMessage("keyless", nil))
		}
		s.write(t, true, q, msgs...)
	}

	r, err := router.New(router.Config{Connection: s.env.Connection(), Declare: top,
		Topology: topology.Config{Delay: s.env.Delay(topology.Delay{QueueType: topology.Classic})}}, s.env.Logger())
	require.NoError(t, err)
	var (
		mu  sync.Mutex
		got = map[string][]string{}
		n   int
	)
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: q, Lanes: lanes}, func(msg *message.Message) error {
		mu.Lock()
		defer mu.Unlock()
		got[warren.OrderKey(msg)] = append(got[warren.OrderKey(msg)], msg.UUID)
		n++
		return nil
	}))
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() { _ = r.Close(); assert.NoError(t, <-done) })
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return n == keys*seqs },
		testenv.Patience(), 50*time.Millisecond)
	mu.Lock()
	for k := range keys {
		var want []string
		for seq := range seqs {
			want = append(want, fmt.Sprintf("k%d/%d", k, seq))
		}
		assert.Equal(t, want, got[fmt.Sprintf("k%d", k)])
	}
	mu.Unlock()
	require.Eventually(t, func() bool { w, a := s.rows(t); return w == 0 && a == 1 },
		testenv.Patience(), 50*time.Millisecond, "the keyless row set aside, the others published")
	var reason string
	require.NoError(t, s.pool.QueryRow(context.Background(), "SELECT reason FROM "+
		pgx.Identifier{s.schema, "outbox"}.Sanitize()+" WHERE set_aside IS NOT NULL").Scan(&reason))
	assert.Contains(t, reason, warren.ErrNoOrderKey.Error())
}
