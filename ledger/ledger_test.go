package ledger_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/amqpx"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/ledger"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// fixture is a publisher, a ledger and (started by consume) a router, on delay levels of the
// test's own.
type fixture struct {
	env   *testenv.Env
	delay topology.Delay
	pub   *dlx.Publisher
	l     *ledger.Ledger
}

func newFixture(t *testing.T) *fixture { return newFixtureAt(t, testenv.New(t)) }

func newFixtureAt(t *testing.T, env *testenv.Env) *fixture {
	f := &fixture{env: env, delay: env.Delay(topology.Delay{})}
	var err error
	f.pub, err = dlx.NewPublisher(dlx.Config{Connection: env.Connection(), Topology: topology.Config{Delay: f.delay}}, env.Logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.pub.Close() })
	f.l, err = ledger.New(ledger.Config{Connection: env.Connection(), Delay: f.delay}, env.Logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.l.Close() })
	return f
}

// schedule publishes a message with body id to queue, due after d, under schedule id id.
func (f *fixture) schedule(t *testing.T, queue, id string, d time.Duration) {
	msg := message.NewMessage(id, []byte(id))
	warren.Delay(msg, d)
	require.Equal(t, id, warren.Schedule(msg, ""), "the message's UUID by default")
	require.NoError(t, f.pub.Publish(queue, msg))
}

// consume runs a router whose handler of queue has the ledger's middleware; it returns the
// bodies handled so far.
func (f *fixture) consume(t *testing.T, queue string) func() []string {
	r, err := router.New(router.Config{Connection: f.env.Connection(), Topology: topology.Config{Delay: f.delay}}, f.env.Logger())
	require.NoError(t, err)
	var (
		mu      sync.Mutex
		handled []string
	)
	require.NoError(t, r.AddConsumerHandler(router.HandlerConfig{Queue: queue, Middleware: []message.HandlerMiddleware{f.l.Middleware}},
		func(msg *message.Message) error {
			mu.Lock()
			handled = append(handled, string(msg.Payload))
			mu.Unlock()
			return nil
		}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); assert.NoError(t, r.Run(ctx)) }()
	t.Cleanup(func() { cancel(); <-done })
	<-r.Running()
	return func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), handled...)
	}
}

// Records warren did not write (anyone who may publish to the default exchange can append to
// the stream) are ignored: none stops a reader or shows in a list, and the ledger goes on. On
// a node of its own (hostile input).
func TestForgedRecordsAreIgnored(t *testing.T) {
	t.Parallel()
	node := testenv.StartNode(t)
	f := newFixtureAt(t, testenv.NewAt(t, node.URL()))
	q := f.env.Queue("reminders")
	f.schedule(t, q, "real", time.Minute)
	ch := f.env.Channel()
	require.NoError(t, ch.Confirm(false))
	for _, body := range []string{`{"op":"scheduled"}`, `{"op":"cancelled"}`, `{"op":"delivered","token":"x"}`,
		`{"op":"scheduled","id":"no-entry"}`, `{"op":"scheduled","id":"bad","entry":{"due":"tomorrow"}}`,
		`{"op":"other","id":"real"}`, `{"op":"mark","id":"real"}`, `not json`, `null`, `[]`, ``,
		`{"op":"cancelled","id":"real","id_base64":"not base64!"}`,
		`{"op":"scheduled","id":"x","id_base64":"eA==","entry":{"id":"x","id_base64":"!","queue":"q"}}`} {
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", f.delay.LedgerQueue(), false, false,
			amqp.Publishing{Body: []byte(body)})
		require.NoError(t, err)
		ok, err := dc.WaitContext(context.Background())
		require.NoError(t, err)
		require.True(t, ok, "record %s confirmed", body)
	}

	ids := func(l *ledger.Ledger) []string {
		entries, err := l.List(context.Background(), ledger.Filter{})
		require.NoError(t, err)
		var ids []string
		for _, e := range entries {
			ids = append(ids, e.ID)
		}
		return ids
	}
	assert.Equal(t, []string{"real"}, ids(f.l))
	fresh, err := ledger.New(ledger.Config{Connection: f.env.Connection(), Delay: f.delay}, f.env.Logger())
	require.NoError(t, err)
	defer fresh.Close()
	assert.Equal(t, []string{"real"}, ids(fresh), "a ledger that reads the stream from its start")
	require.NoError(t, fresh.Cancel(context.Background(), "real"))
	assert.Empty(t, ids(f.l))
}

// A cancelled message never reaches the handler, even one cancelled before it was scheduled;
// its neighbours, due at the same time, do. A cancel after the delivery says so; a cancel of
// an id never scheduled too.
func TestCancelledMessagesAreNeverHandled(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.env.Queue("reminders")
	handled := f.consume(t, q)
	ctx := context.Background()
	// A cancellation before the schedule stands too.
	require.ErrorIs(t, f.l.Cancel(ctx, "reminder-5"), ledger.ErrUnknown)
	for i := range 10 {
		f.schedule(t, q, fmt.Sprintf("reminder-%d", i), 1500*time.Millisecond)
	}
	require.NoError(t, f.l.Cancel(ctx, "reminder-3"))
	require.NoError(t, f.l.Cancel(ctx, "reminder-7"))
	require.NoError(t, f.l.Cancel(ctx, "reminder-7"), "twice")

	require.Eventually(t, func() bool { return len(handled()) == 7 }, testenv.Patience(), 10*time.Millisecond)
	assert.Never(t, func() bool { return len(handled()) > 7 }, 500*time.Millisecond, 10*time.Millisecond,
		"a cancelled one, due with them, handled")
	assert.ElementsMatch(t, []string{"reminder-0", "reminder-1", "reminder-2", "reminder-4", "reminder-6",
		"reminder-8", "reminder-9"}, handled())

	assert.ErrorIs(t, f.l.Cancel(ctx, "reminder-1"), ledger.ErrDelivered)
	assert.ErrorIs(t, f.l.Cancel(ctx, "never-scheduled"), ledger.ErrUnknown)
	entries, err := f.l.List(ctx, ledger.Filter{})
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing waits any more")
}

// List shows exactly what waits (id, destination, due), filtered by destination and due
// time; a cancellation and a delivery take an entry off. Another Ledger, as another process
// would, sees the same.
func TestListShowsWhatWaits(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a, b := f.env.Queue("a"), f.env.Queue("b")
	f.schedule(t, a, "a-soon", 800*time.Millisecond)
	before := time.Now()
	f.schedule(t, a, "a-later", time.Minute)
	after := time.Now()
	f.schedule(t, b, "b-later", 50*time.Second)
	unlisted := message.NewMessage("not-scheduled", nil)
	warren.Delay(unlisted, time.Minute) // delayed, but without a schedule id
	require.NoError(t, f.pub.Publish(a, unlisted))

	ctx := context.Background()
	entries, err := f.l.List(ctx, ledger.Filter{})
	require.NoError(t, err)
	require.Len(t, entries, 3)
	assert.Equal(t, []string{"a-soon", "b-later", "a-later"}, []string{entries[0].ID, entries[1].ID, entries[2].ID}, "by due time")
	assert.Equal(t, a, entries[0].Destination())
	assert.False(t, entries[2].Due.Before(before.Add(time.Minute)) || entries[2].Due.After(after.Add(time.Minute)),
		"due %s: a minute after it was scheduled, between %s and %s", entries[2].Due, before, after)

	only, err := f.l.List(ctx, ledger.Filter{Destination: b})
	require.NoError(t, err)
	assert.Len(t, only, 1)
	soon, err := f.l.List(ctx, ledger.Filter{Before: entries[1].Due.Add(entries[2].Due.Sub(entries[1].Due) / 2)})
	require.NoError(t, err)
	assert.Len(t, soon, 2)

	require.NoError(t, f.l.Cancel(ctx, "b-later"))
	handled := f.consume(t, a)
	require.Eventually(t, func() bool { return len(handled()) == 1 }, testenv.Patience(), 10*time.Millisecond)

	other, err := ledger.New(ledger.Config{Connection: f.env.Connection(), Delay: f.delay}, nil)
	require.NoError(t, err)
	defer other.Close()
	left, err := other.List(ctx, ledger.Filter{})
	require.NoError(t, err)
	require.Len(t, left, 1)
	assert.Equal(t, "a-later", left[0].ID)
}

func TestConfigValidationNamesTheField(t *testing.T) {
	for field, cfg := range map[string]ledger.Config{
		"Config.Connection.URL":    {},
		"Config.Delay: topology":   {Connection: testenv.Logic(t).Connection(), Delay: topology.Delay{Radix: 1}},
		"Config.Delay is disabled": {Connection: testenv.Logic(t).Connection(), Delay: topology.Delay{Disabled: true}},
		"Config.Timeout -1s":       {Connection: testenv.Logic(t).Connection(), Timeout: -time.Second},
	} {
		_, err := ledger.New(cfg, nil)
		assert.ErrorContains(t, err, field)
	}
}

// Pairs of ids that JSON alone would not keep apart: each id of a pair is listed as it is,
// the first is cancelled, and only the second is handled. A ledger that reads the stream
// from its start lists them exactly too.
var idPairs = [][2]string{
	{"order-7\xff", "order-7\xfe"},  // differ only in a byte that is not UTF-8
	{"tick\x00", "tick\ufffd"},      // NUL and U+FFFD
	{"bad\xff", "bad\ufffd"},        // a byte that is not UTF-8 and U+FFFD itself
	{"ctl\u009b", "ctl\x9b"},        // a C1 control, and its code as a lone byte
	{"\xc3\x28\x00", "\ufffd(\x00"}, // a broken sequence, and what JSON would make of it
}

func TestIDsAreKeptExactly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.env.Queue("exact")
	ctx := context.Background()
	var all, kept []string
	for _, p := range idPairs {
		f.schedule(t, q, p[0], 2*time.Second)
		f.schedule(t, q, p[1], 2*time.Second)
		all, kept = append(all, p[0], p[1]), append(kept, p[1])
	}
	ids := func(l *ledger.Ledger) []string {
		entries, err := l.List(ctx, ledger.Filter{Destination: q})
		require.NoError(t, err)
		var ids []string
		for _, e := range entries {
			ids = append(ids, e.ID)
		}
		return ids
	}
	assert.ElementsMatch(t, all, ids(f.l))
	for _, p := range idPairs {
		require.NoError(t, f.l.Cancel(ctx, p[0]), "%q", p[0])
	}
	assert.ElementsMatch(t, kept, ids(f.l), "the second of each pair still waits")
	fresh, err := ledger.New(ledger.Config{Connection: f.env.Connection(), Delay: f.delay}, f.env.Logger())
	require.NoError(t, err)
	defer fresh.Close()
	assert.ElementsMatch(t, kept, ids(fresh), "read from the stream's start")

	handled := f.consume(t, q)
	require.Eventually(t, func() bool { return len(handled()) == len(kept) }, testenv.Patience(), 10*time.Millisecond)
	assert.Never(t, func() bool { return len(handled()) > len(kept) }, 500*time.Millisecond, 10*time.Millisecond,
		"a cancelled one handled")
	assert.ElementsMatch(t, kept, handled())
	for _, p := range idPairs {
		assert.ErrorIs(t, fresh.Cancel(ctx, p[1]), ledger.ErrDelivered, "%q", p[1])
		assert.NoError(t, fresh.Cancel(ctx, p[0]), "%q: cancelled, never delivered", p[0])
	}
}

// Records that an earlier version wrote for ids that are not UTF-8 hold each such byte as
// U+FFFD, and no exact copy: they are read as written, and still decide for the message,
// which arrives with its exact id. A cancellation recorded then stops it; so does one made
// now of the id as listed; a message not cancelled is handled, and a cancellation after it
// says it was delivered.
func TestRecordsOfEarlierVersionsStillHold(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.env.Queue("legacy")
	ctx := context.Background()
	_, err := f.l.List(ctx, ledger.Filter{}) // the ledger is declared now
	require.NoError(t, err)
	ch := f.env.Channel()
	require.NoError(t, ch.Confirm(false))
	appendOld := func(op, id string, entry bool) {
		t.Helper()
		r := map[string]any{"op": op, "id": id, "at": time.Now().UTC()}
		if entry {
			r["entry"] = map[string]any{"id": id, "queue": q, "due": time.Now().Add(time.Minute).UTC(), "scheduled": time.Now().UTC()}
		} else {
			r["token"] = "earlier"
		}
		body, err := json.Marshal(r) // as the earlier version: no id_base64, each bad byte as U+FFFD
		require.NoError(t, err)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", f.delay.LedgerQueue(), false, false,
			amqp.Publishing{ContentType: "application/json", Body: body})
		require.NoError(t, err)
		ok, err := dc.WaitContext(ctx)
		require.NoError(t, err)
		require.True(t, ok)
	}
	appendOld("scheduled", "cancelled-then-\xff", true)
	appendOld("cancelled", "cancelled-then-\xff", false)
	appendOld("scheduled", "cancelled-now-\xfe", true)
	appendOld("scheduled", "kept-\xfd", true)

	entries, err := f.l.List(ctx, ledger.Filter{})
	require.NoError(t, err)
	var listed []string
	for _, e := range entries {
		listed = append(listed, e.ID)
	}
	assert.ElementsMatch(t, []string{"cancelled-now-\ufffd", "kept-\ufffd"}, listed, "as the records have them")
	require.NoError(t, f.l.Cancel(ctx, "cancelled-now-\ufffd"), "the id as listed")

	handled := f.consume(t, q)
	for _, id := range []string{"cancelled-then-\xff", "cancelled-now-\xfe", "kept-\xfd"} {
		msg := message.NewMessage(id, []byte(id))
		msg.Metadata.Set(warren.MetadataScheduleID, id)
		p, err := warren.Marshaler{}.Marshal(msg)
		require.NoError(t, err)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", q, true, false, p)
		require.NoError(t, err)
		ok, err := dc.WaitContext(ctx)
		require.NoError(t, err)
		require.True(t, ok)
	}
	require.Eventually(t, func() bool { return len(handled()) == 1 }, testenv.Patience(), 10*time.Millisecond)
	assert.Never(t, func() bool { return len(handled()) > 1 }, 500*time.Millisecond, 10*time.Millisecond, "a cancelled one handled")
	assert.Equal(t, []string{"kept-\xfd"}, handled())
	assert.ErrorIs(t, f.l.Cancel(ctx, "kept-\ufffd"), ledger.ErrDelivered, "the id as listed")
	assert.ErrorIs(t, f.l.Cancel(ctx, "kept-\xfd"), ledger.ErrDelivered, "the exact id")
	entries, err = f.l.List(ctx, ledger.Filter{})
	require.NoError(t, err)
	assert.Empty(t, entries)

	// The cancellation is final: a message scheduled under the id now is not handled either;
	// one under a new id, due with it, is.
	f.schedule(t, q, "cancelled-then-\xff", time.Second)
	f.schedule(t, q, "new-\xff", time.Second)
	require.Eventually(t, func() bool { return len(handled()) == 2 }, testenv.Patience(), 10*time.Millisecond)
	assert.Never(t, func() bool { return len(handled()) > 2 }, 500*time.Millisecond, 10*time.Millisecond, "a cancelled one handled")
	assert.Equal(t, []string{"kept-\xfd", "new-\xff"}, handled())
}

// The longest schedule id a message can carry (the header frame's limit) is kept exactly
// too: two such ids that differ in their last byte only, one cancelled, the other handled.
func TestLongestIDsAreKeptExactly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.env.Queue("longest")
	ctx := context.Background()
	pattern := []byte("\xff\x00\ufffd\u0085")
	id := func(n int, last byte) string {
		b := bytes.Repeat(pattern, n/len(pattern)+1)[:n]
		b[n-1] = last
		return string(b)
	}
	scheduled := func(uuid, sid string) *message.Message {
		msg := message.NewMessage(uuid, []byte(uuid))
		warren.Delay(msg, 2*time.Second)
		warren.Schedule(msg, sid)
		// The id of the publish (a header) at its longest, 16 hex digits: the same size on
		// every publish, and one of its own (a copy of a publish is handled once).
		msg.Metadata.Set(warren.MetadataPublishID, fmt.Sprintf("%016x", rand.Uint64()|1<<63))
		return msg
	}
	// How far over the limit an id of amqpx.MaxHeaderFrame bytes takes the message: the
	// longest id is that much shorter.
	err := f.pub.Publish(q, scheduled("a", id(amqpx.MaxHeaderFrame, 0xff)))
	require.ErrorIs(t, err, warren.ErrTooLarge)
	m := regexp.MustCompile(`(\d+) bytes, the limit is (\d+)`).FindStringSubmatch(err.Error())
	require.NotNil(t, m, err.Error())
	size, _ := strconv.Atoi(m[1])
	limit, _ := strconv.Atoi(m[2])
	n := amqpx.MaxHeaderFrame - (size - limit)
	require.ErrorIs(t, f.pub.Publish(q, scheduled("a", id(n+1, 0xff))), warren.ErrTooLarge, "one byte more")
	cancelled, kept := id(n, 0xff), id(n, 0xfe)
	require.NoError(t, f.pub.Publish(q, scheduled("a", cancelled)))
	require.NoError(t, f.pub.Publish(q, scheduled("b", kept)))
	t.Logf("the longest schedule id: %d bytes", n)

	entries, err := f.l.List(ctx, ledger.Filter{Destination: q})
	require.NoError(t, err)
	require.Len(t, entries, 2)
	assert.True(t, entries[0].ID == cancelled && entries[1].ID == kept || entries[0].ID == kept && entries[1].ID == cancelled,
		"both listed exactly")
	require.NoError(t, f.l.Cancel(ctx, cancelled))
	handled := f.consume(t, q)
	require.Eventually(t, func() bool { return len(handled()) == 1 }, testenv.Patience(), 10*time.Millisecond)
	assert.Never(t, func() bool { return len(handled()) > 1 }, 500*time.Millisecond, 10*time.Millisecond, "the cancelled one handled")
	assert.Equal(t, []string{"b"}, handled())
	assert.ErrorIs(t, f.l.Cancel(ctx, kept), ledger.ErrDelivered)
}

// The ledger's connection is reported as every component's is: Connection.OnEvent hears it
// connected, lost (reconnecting) and connected again, and the ledger works on the new one.
func TestLedgerConnectionIsReported(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	proxy, url := testenv.ProxyURL(t, env.URL)
	events := make(chan warren.ConnectionEvent, 64)
	conn := warren.Connection{URL: url, OnEvent: func(e warren.ConnectionEvent) {
		select {
		case events <- e:
		default: // the test has what it needs
		}
	}}
	l, err := ledger.New(ledger.Config{Connection: conn, Delay: env.Delay(topology.Delay{})}, env.Logger())
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	expect := func(state warren.ConnectionState) {
		t.Helper()
		select {
		case e := <-events:
			assert.Equal(t, state, e.State, "%+v", e)
			assert.Equal(t, "warren ledger", e.Name)
			assert.Equal(t, proxy.Addr(), e.Node)
		case <-time.After(testenv.Patience()):
			t.Fatalf("no %s event", state)
		}
	}
	expect(warren.Connected)
	_, err = l.List(t.Context(), ledger.Filter{})
	require.NoError(t, err)
	proxy.Drop()
	expect(warren.Reconnecting)
	expect(warren.Connected)
	_, err = l.List(t.Context(), ledger.Filter{})
	require.NoError(t, err, "the ledger works on its new connection")
}
