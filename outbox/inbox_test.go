package outbox_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/middleware"
	"github.com/warrenmq/warren/outbox"
	"github.com/warrenmq/warren/router"
	"github.com/warrenmq/warren/topology"
)

// effects makes the table the handlers of these tests write to, one row per run.
func (s *setup) effects(t *testing.T) string {
	t.Helper()
	tbl := pgx.Identifier{s.schema, "effects"}.Sanitize()
	_, err := s.pool.Exec(context.Background(), "CREATE TABLE "+tbl+" (uuid text NOT NULL, attempt int NOT NULL)")
	require.NoError(t, err)
	return tbl
}

// effectsOf counts the rows of tbl per uuid.
func (s *setup) effectsOf(t *testing.T, tbl string) map[string]int {
	t.Helper()
	rows, err := s.pool.Query(context.Background(), "SELECT uuid, count(*) FROM "+tbl+" GROUP BY uuid")
	require.NoError(t, err)
	got := map[string]int{}
	for rows.Next() {
		var (
			id string
			n  int
		)
		require.NoError(t, rows.Scan(&id, &n))
		got[id] = n
	}
	require.NoError(t, rows.Err())
	return got
}

func (s *setup) inbox(t *testing.T, mod func(*outbox.InboxConfig)) *outbox.Inbox {
	t.Helper()
	cfg := outbox.InboxConfig{Pool: s.pool, Schema: s.schema}
	if mod != nil {
		mod(&cfg)
	}
	in, err := outbox.NewInbox(cfg, s.env.Logger())
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, in.Close()) })
	return in
}

// runRouter runs a router with a short retry schedule and the handler h on q, inside in's
// middleware and then the outer ones, until the test ends.
func (s *setup) runRouter(t *testing.T, q string, h router.HandlerConfig, fn message.HandlerFunc) {
	t.Helper()
	r, err := router.New(router.Config{
		Connection:      s.env.Connection(),
		ShutdownTimeout: 10 * time.Second,
		Topology:        topology.Config{Delay: s.env.Delay(topology.Delay{QueueType: topology.Classic})},
		Retry:           middleware.BackoffConfig{Delays: []time.Duration{100 * time.Millisecond, 100 * time.Millisecond}},
	}, s.env.Logger())
	require.NoError(t, err)
	h.Queue = q
	require.NoError(t, r.AddHandler(h, fn))
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
		_ = r.Close()
	})
	select {
	case <-r.Running():
	case err := <-done:
		t.Fatalf("router stopped at once: %v", err)
	case <-time.After(testenv.Patience()):
		t.Fatal("router did not start")
	}
}

// A handler's writes commit with its message's key: a second publish of the message (same
// id) and a retry after the commit (as when the ack is lost) are acked without running it
// again; a failure rolls the writes back and the retry writes them once.
func TestInboxTakesEffectOnce(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	q := s.env.Queue("inbox")
	tbl := s.effects(t)
	in := s.inbox(t, nil)
	var runs atomic.Int64
	lostAck := &atomic.Bool{} // the first run of "lost-ack" commits, then fails outside the inbox
	lostAck.Store(true)
	outer := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := h(msg)
			if err == nil && msg.UUID == "lost-ack" && lostAck.CompareAndSwap(true, false) {
				return nil, errors.New("the ack was lost")
			}
			return out, err
		}
	}
	s.runRouter(t, q, router.HandlerConfig{Middleware: []message.HandlerMiddleware{outer, in.Middleware}},
		func(msg *message.Message) ([]*message.Message, error) {
			runs.Add(1)
			tx, ok := outbox.TxFrom(msg.Context())
			require.True(t, ok)
			attempt := middleware.Attempt(msg)
			if _, err := tx.Exec(msg.Context(), "INSERT INTO "+tbl+" VALUES ($1, $2)", msg.UUID, attempt); err != nil {
				return nil, err
			}
			if msg.UUID == "fails-once" && attempt == 1 {
				return nil, errors.New("failed after writing")
			}
			return nil, nil
		})

	pub := s.publisher(t, q, nil)
	for _, id := range []string{"once", "once", "fails-once", "lost-ack"} {
		require.NoError(t, pub.Publish(q, message.NewMessage(id, nil)))
	}
	want := map[string]int{"once": 1, "fails-once": 1, "lost-ack": 1}
	require.Eventually(t, func() bool { return assert.ObjectsAreEqual(want, s.effectsOf(t, tbl)) },
		testenv.Patience(), 50*time.Millisecond)
	assert.Never(t, func() bool { return !assert.ObjectsAreEqual(want, s.effectsOf(t, tbl)) },
		time.Second, 50*time.Millisecond, "no effect twice")
	// once, fails-once twice, lost-ack once: the second "once" and lost-ack's retry are not run.
	assert.Equal(t, int64(4), runs.Load())
}

// What the handler returns goes through the outbox in its transaction, and the relay
// publishes it.
func TestInboxOutputGoesThroughTheOutbox(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	q, next := s.env.Queue("in"), s.env.Queue("next")
	in := s.inbox(t, func(c *outbox.InboxConfig) { c.OutputTopic = next })
	s.runRouter(t, q, router.HandlerConfig{Middleware: []message.HandlerMiddleware{in.Middleware}},
		func(msg *message.Message) ([]*message.Message, error) {
			return []*message.Message{message.NewMessage("out-of-"+msg.UUID, msg.Payload)}, nil
		})
	pub := s.publisher(t, next, nil)
	s.relay(t, pub, nil)
	require.NoError(t, pub.Publish(q, message.NewMessage("a", []byte("x"))))
	got := consume(t, s.env, next, 1, time.Second)
	assert.Equal(t, []string{"out-of-a"}, uuids(got))
	assert.Equal(t, "x", string(got[0].msg.Payload))
}

// A handler that returns messages with no OutputTopic is poisoned, and nothing commits.
func TestInboxWithoutOutputTopicRefusesOutput(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	q := s.env.Queue("noout")
	tbl := s.effects(t)
	in := s.inbox(t, nil)
	s.runRouter(t, q, router.HandlerConfig{Middleware: []message.HandlerMiddleware{in.Middleware}},
		func(msg *message.Message) ([]*message.Message, error) {
			tx, _ := outbox.TxFrom(msg.Context())
			if _, err := tx.Exec(msg.Context(), "INSERT INTO "+tbl+" VALUES ($1, 1)", msg.UUID); err != nil {
				return nil, err
			}
			return []*message.Message{message.NewMessage("out", nil)}, nil
		})
	pub := s.publisher(t, q, nil)
	require.NoError(t, pub.Publish(q, message.NewMessage("a", nil)))
	got := consume(t, s.env, q+".poison", 1, 0)
	assert.Contains(t, got[0].msg.Metadata.Get(warren.PoisonErrorKey), "OutputTopic is empty")
	assert.Empty(t, s.effectsOf(t, tbl))
}

// Keys past the retention go; newer ones stay.
func TestInboxExpire(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	in := s.inbox(t, func(c *outbox.InboxConfig) { c.Retention = time.Hour })
	inbox := pgx.Identifier{s.schema, "inbox"}.Sanitize()
	_, err := s.pool.Exec(context.Background(), "INSERT INTO "+inbox+" (key, handled) VALUES ('old', now() - interval '2 hours'), ('new', now())")
	require.NoError(t, err)
	n, err := in.Expire(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	var keys []string
	rows, err := s.pool.Query(context.Background(), "SELECT convert_from(key, 'UTF8') FROM "+inbox)
	require.NoError(t, err)
	keys, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	assert.Equal(t, []string{"new"}, keys)
}

// Two deliveries of one key at once: the second waits for the first's transaction; it is
// acked without running the handler when the first committed, and runs it when the first
// rolled back. A key holds any bytes.
func TestInboxOneKeyAtOnce(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	tbl := s.effects(t)
	in := s.inbox(t, func(c *outbox.InboxConfig) { c.Key = func(m *message.Message) string { return m.UUID } })
	for _, commit := range []bool{true, false} {
		label := map[bool]string{true: "committed", false: "rolled back"}[commit]
		key := "it's \x00 a \\ key'); -- " + label
		started, finish := make(chan struct{}), make(chan struct{})
		var runs atomic.Int64
		h := in.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			if runs.Add(1) == 1 {
				close(started)
				<-finish
			}
			tx, _ := outbox.TxFrom(msg.Context())
			if _, err := tx.Exec(msg.Context(), "INSERT INTO "+tbl+" VALUES ($1, 1)", label); err != nil {
				return nil, err
			}
			if runs.Load() == 1 && !commit {
				return nil, errors.New("rolled back")
			}
			return nil, nil
		})
		first, second := make(chan error, 1), make(chan error, 1)
		go func() { _, err := h(message.NewMessage(key, nil)); first <- err }()
		<-started
		go func() { _, err := h(message.NewMessage(key, nil)); second <- err }()
		// The second waits for the lock on the key that the first's transaction holds.
		require.Eventually(t, func() bool {
			var waiting bool
			require.NoError(t, s.pool.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM pg_stat_activity "+
				"WHERE wait_event_type = 'Lock' AND query LIKE '%'||$1||'%')", s.schema+`"."inbox`).Scan(&waiting))
			return waiting
		}, testenv.Patience(), 10*time.Millisecond)
		close(finish)
		if commit {
			require.NoError(t, <-first)
			require.NoError(t, <-second)
			assert.Equal(t, int64(1), runs.Load(), "acked without running the handler")
		} else {
			require.Error(t, <-first)
			require.NoError(t, <-second)
			assert.Equal(t, int64(2), runs.Load(), "the first rolled back: the second runs")
		}
		assert.Equal(t, 1, s.effectsOf(t, tbl)[label])
		var recorded bool
		require.NoError(t, s.pool.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM "+
			pgx.Identifier{s.schema, "inbox"}.Sanitize()+" WHERE key = $1)", []byte(key)).Scan(&recorded))
		assert.True(t, recorded, "the key is recorded byte for byte")
	}
}

// A database that cannot be reached when a message comes (here: its address answers only
// after a while) holds the handler up, within InboxConfig.Timeout, instead of failing it.
func TestInboxWaitsOutAShortOutage(t *testing.T) {
	t.Parallel()
	s := newSetup(t)
	tbl := s.effects(t)
	// A port nothing listens on yet, which later forwards to the database.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	cfg, err := pgxpool.ParseConfig(testenv.PostgresURL())
	require.NoError(t, err)
	target := net.JoinHostPort(cfg.ConnConfig.Host, strconv.Itoa(int(cfg.ConnConfig.Port)))
	host, port, _ := net.SplitHostPort(addr)
	cfg.ConnConfig.Host = host
	p, _ := strconv.Atoi(port)
	cfg.ConnConfig.Port = uint16(p)
	away, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer away.Close()
	in := s.inbox(t, func(c *outbox.InboxConfig) {
		c.Pool = away
		c.Key = func(m *message.Message) string { return m.UUID }
		c.Timeout = testenv.Patience()
	})
	var runs atomic.Int64
	h := in.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		runs.Add(1)
		tx, _ := outbox.TxFrom(msg.Context())
		_, err := tx.Exec(msg.Context(), "INSERT INTO "+tbl+" VALUES ($1, 1)", msg.UUID)
		return nil, err
	})
	done := make(chan error, 1)
	go func() { _, err := h(message.NewMessage("during the outage", nil)); done <- err }()
	assert.Never(t, func() bool { return len(done) > 0 }, 300*time.Millisecond, 10*time.Millisecond,
		"the handler waits while the database cannot be reached")
	proxy := forward(t, addr, target)
	defer proxy.Close()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(testenv.Patience()):
		t.Fatal("the handler did not run once the database answered")
	}
	assert.Equal(t, int64(1), runs.Load())
	assert.Equal(t, map[string]int{"during the outage": 1}, s.effectsOf(t, tbl))
}

// forward listens on addr and copies every connection to target and back, until closed.
func forward(t *testing.T, addr, target string) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				u, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer u.Close()
				go func() { _, _ = io.Copy(u, c); _ = u.Close() }()
				_, _ = io.Copy(c, u)
			}()
		}
	}()
	return l
}
