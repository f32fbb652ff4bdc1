package ui_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/held"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/outbox"
	"github.com/warrenmq/warren/topology"
	"github.com/warrenmq/warren/ui"
)

// poison publishes n messages into queue's poison queue as the Poison middleware writes them:
// even ones failed with "card declined", odd ones with "order N not found"; headers[i] (if
// any) are added to message i.
func poison(t *testing.T, env *testenv.Env, queue string, n int, headers ...amqp.Table) {
	t.Helper()
	ch := env.Channel()
	require.NoError(t, ch.Confirm(false))
	var last *amqp.DeferredConfirmation
	for i := range n {
		errText := "card declined"
		if i%2 == 1 {
			errText = fmt.Sprintf("order %d not found", i)
		}
		at := time.Date(2026, 11, 25, 10, 0, i%60, 0, time.UTC)
		h := amqp.Table{
			warren.PoisonErrorKey: errText, warren.PoisonErrorTypeKey: "*errors.errorString",
			warren.PoisonReasonKey: warren.PoisonReasonExhausted, warren.PoisonHandlerKey: "charge",
			warren.PoisonQueueKey: queue, warren.PoisonAttemptsKey: "4",
			warren.PoisonLastFailKey: at.Format(time.RFC3339Nano), warren.PoisonFirstFailKey: at.Add(-time.Second).Format(time.RFC3339Nano),
			"tenant": "t" + strconv.Itoa(i%2),
		}
		if i < len(headers) {
			for k, v := range headers[i] {
				h[k] = v
			}
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "", topology.PoisonQueue(queue), true, false,
			amqp.Publishing{MessageId: "m" + strconv.Itoa(i), ContentType: "application/json", DeliveryMode: amqp.Persistent,
				Body: []byte(fmt.Sprintf(`{"order":%d,"items":[1,2]}`, i)), Headers: h})
		require.NoError(t, err)
		last = dc
	}
	if last != nil {
		ok, err := last.WaitContext(context.Background())
		require.NoError(t, err)
		require.True(t, ok)
	}
}

// depth is the number of messages in queue.
func depth(t *testing.T, env *testenv.Env, queue string) int {
	t.Helper()
	q, err := env.Channel().QueueDeclarePassive(queue, true, false, false, false, nil)
	require.NoError(t, err)
	return q.Messages
}

// server serves a Handler of cfg (Ops on url unless set) and returns it with a browser (a
// client with a cookie jar that does not follow redirects).
func server(t *testing.T, url string, cfg ui.Config, logger watermill.LoggerAdapter) (*httptest.Server, *browser) {
	t.Helper()
	if cfg.Ops == nil {
		o, err := ops.New(ops.Config{Connection: warren.Connection{URL: url}, Timeout: 10 * time.Second}, nil)
		require.NoError(t, err)
		t.Cleanup(func() { _ = o.Close() })
		cfg.Ops = o
	}
	h, err := ui.New(cfg, logger)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.Close()
		require.NoError(t, h.Close())
	})
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return srv, &browser{t: t, base: srv.URL + cfg.Prefix, c: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// browser gets pages and posts forms as a browser of the dashboard's origin would.
type browser struct {
	t    *testing.T
	base string
	c    *http.Client
}

func (b *browser) get(path string) (int, string) {
	b.t.Helper()
	resp, err := b.c.Get(b.base + path)
	require.NoError(b.t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(b.t, err)
	return resp.StatusCode, string(body)
}

// post sends form to path with the CSRF token of the last page read (unless form has one).
func (b *browser) post(path string, form url.Values, token string) *http.Response {
	b.t.Helper()
	if form.Get("csrf") == "" && token != "" {
		form.Set("csrf", token)
	}
	req, err := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	require.NoError(b.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := b.c.Do(req)
	require.NoError(b.t, err)
	b.t.Cleanup(func() { _ = resp.Body.Close() })
	return resp
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(body)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// token is the CSRF token of a page's forms.
func token(t *testing.T, page string) string {
	t.Helper()
	m := csrfRE.FindStringSubmatch(page)
	require.NotNil(t, m, "no form with a CSRF token in the page")
	return m[1]
}

func TestConfigValidate(t *testing.T) {
	o, err := ops.New(ops.Config{Connection: warren.Connection{URL: "amqp://127.0.0.1:1/"}}, nil)
	require.NoError(t, err)
	defer o.Close()
	for cfg, want := range map[*ui.Config]string{
		{}:                                 "ui: Config.Ops is nil",
		{Ops: o, Prefix: "warren"}:         `ui: Config.Prefix "warren": want a path that starts with / and does not end with one`,
		{Ops: o, Prefix: "/warren/"}:       `ui: Config.Prefix "/warren/": want a path that starts with / and does not end with one`,
		{Ops: o, PageSize: -1}:             "ui: Config.PageSize -1 is negative",
		{Ops: o, CSRFKey: []byte("short")}: "ui: Config.CSRFKey has 5 bytes: want at least 16",
		{Ops: o, CountTimeout: -1}:         "ui: Config.CountTimeout -1ns is negative",
		{Ops: o, Prefix: "/w/{x}"}:         `ui: Config.Prefix "/w/{x}": braces, spaces and control characters are not allowed`,
		{Ops: o, Prefix: "/w}"}:            `ui: Config.Prefix "/w}": braces, spaces and control characters are not allowed`,
		{Ops: o, Prefix: "/my queues"}:     `ui: Config.Prefix "/my queues": braces, spaces and control characters are not allowed`,
		{Ops: o, Prefix: "/w\tx"}:          `ui: Config.Prefix "/w\tx": braces, spaces and control characters are not allowed`,
		{Ops: o, Prefix: "/a//b"}:          `ui: Config.Prefix "/a//b": want a clean path (no //, . or .. segment)`,
		{Ops: o, Prefix: "/a/../b"}:        `ui: Config.Prefix "/a/../b": want a clean path (no //, . or .. segment)`,
		{Ops: o, Outbox: &ui.Outbox{}}:     "ui: Config.Outbox.DB is nil",
		{Ops: o, Outbox: &ui.Outbox{DB: (*pgxpool.Pool)(nil), Schema: "a\x00b"}}: `ui: Config.Outbox: outbox: Config.Schema: "a\x00b" holds a NUL byte`,
	} {
		_, err := ui.New(*cfg, nil)
		assert.EqualError(t, err, want)
	}
}

// The overview shows each work queue's depth, consumers and poison count, and the delay
// levels; its charts appear once two samples are taken.
func TestOverview(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("overview")
	poison(t, env, q, 3)
	missing := env.Name("missing")
	delay := topology.Delay{Prefix: env.Name("delay"), Unit: time.Second, Radix: 4, Levels: 2}
	env.Remove(delay.Names())
	b0, err := topology.NewBuilder(topology.Config{Delay: delay}, nil)
	require.NoError(t, err)
	require.NoError(t, b0.Apply(context.Background(), env.Connection(), topology.Topology{}))
	require.NoError(t, env.Channel().PublishWithContext(context.Background(), "", delay.LevelQueue(1, 3), false, false,
		amqp.Publishing{Body: []byte("waits 12s")}))
	o, err := ops.New(ops.Config{Connection: env.Connection(), Delay: delay}, nil)
	require.NoError(t, err)
	defer o.Close()
	_, b := server(t, env.URL, ui.Config{Ops: o, Queues: []string{q, missing}, SampleInterval: 50 * time.Millisecond}, nil)

	status, page := b.get("/")
	require.Equal(t, http.StatusOK, status, page)
	assert.Contains(t, page, "<td>"+q+"</td>")
	assert.Contains(t, page, `/poison?queue=`+q+`">3</a>`)
	assert.Regexp(t, `<tr id="queue-1" class="down problem">\s*<td>`+missing+`</td>\s*<td>missing</td>`, page)
	assert.Contains(t, page, "read-only")
	assert.NotContains(t, page, `action="/kill"`) // read-only: no action is offered
	// one line names what is wrong, and the rows are marked where
	assert.Contains(t, page, `<p id="problems" class="problems" role="status"><strong>To look at:</strong>`+"\n"+
		`<span class="problem"><a href="#queue-0">`+q+`</a>: 3 poison messages, no consumer</span> · `+
		`<span class="problem"><a href="#queue-1">`+missing+`</a>: no such queue</span>`)
	assert.Regexp(t, `<tr id="queue-0" class="problem">\s*<td>`+q+`</td>(?s:.*?)<td class="n flag">0</td>(?s:.*?)<td class="n flag"><a href="/poison\?queue=`+q+`">3</a>`, page)
	if strings.Contains(page, "malformed x-death") { // RabbitMQ 3.10.8's hazard: named once, explained behind a details
		assert.Equal(t, 1, strings.Count(page, "can stop dead-lettering on one malformed message"))
		assert.Regexp(t, `<details class="hazard"><summary>[^<]*</summary><p class="warning">RabbitMQ [0-9.]+: one message with a malformed x-death`, page)
	}
	assert.Contains(t, page, "1 waiting in 6 level queues")
	assert.Contains(t, page, "<td>"+delay.LevelQueue(1, 3)+"</td><td>12 s</td><td>15 s</td><td>-</td><td class=\"n\">1</td>")
	assert.Contains(t, page, "0 parked")

	none, err := ops.New(ops.Config{Connection: env.Connection(), Delay: topology.Delay{Prefix: env.Name("none")}}, nil)
	require.NoError(t, err)
	defer none.Close()
	_, b2 := server(t, env.URL, ui.Config{Ops: none, Queues: []string{q}, SampleInterval: -1}, nil)
	_, page2 := b2.get("/")
	assert.Contains(t, page2, "The delay levels are not declared")
	assert.NotContains(t, page2, "level queue</th>")
	var chart string
	require.Eventually(t, func() bool {
		_, page := b.get("/")
		chart = regexp.MustCompile(`<svg class="chart".*?</svg>`).FindString(page)
		return chart != ""
	}, testenv.Patience(), 50*time.Millisecond)
	// labelled axes: the top of the scale in messages, the time shown, now
	assert.Regexp(t, `<text [^>]*>5 msg</text><text [^>]*>0</text><text [^>]*>-[0-9.]+ (ms|s)</text><text [^>]*>now</text>`, chart)
	assert.Contains(t, chart, `<line class="axis"`)
}

// A broker that cannot be reached shows as an error in the page, with the last values read.
func TestOverviewShowsTheErrorAndTheLastValues(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("down")
	poison(t, env, q, 2)
	proxy, url := testenv.ProxyURL(t, env.URL)
	// Limits that a loaded broker meets (one status reads every delay level queue, and a
	// connect took over 1 s); after the proxy's close the next read fails within them.
	o, err := ops.New(ops.Config{Connection: warren.Connection{URL: url, ConnectTimeout: 10 * time.Second}, Timeout: 10 * time.Second}, nil)
	require.NoError(t, err)
	defer o.Close()
	_, b := server(t, "", ui.Config{Ops: o, Queues: []string{q}, SampleInterval: -1, Timeout: 10 * time.Second}, nil)
	status, page := b.get("/")
	require.Equal(t, http.StatusOK, status, page)

	proxy.Close()
	status, page = b.get("/")
	assert.Equal(t, http.StatusBadGateway, status)
	assert.Contains(t, page, "cannot read the broker")
	assert.Contains(t, page, "Showing the last values read")
	assert.Contains(t, page, `/poison?queue=`+q+`">2</a>`)
}

// The poison page groups the failures, filters on the server, and shows each message's
// detail with its body indented.
func TestPoisonPage(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("poison")
	poison(t, env, q, 7)
	var redacted atomic.Int64
	_, b := server(t, env.URL, ui.Config{Queues: []string{q}, PageSize: 2, SampleInterval: -1, SnapshotAge: time.Hour,
		Redact: func(m *ops.Message) {
			redacted.Add(1)
			if m.Headers["tenant"] == "t1" {
				m.Headers["tenant"] = "***"
			}
		}}, nil)

	status, page := b.get("/poison?queue=" + url.QueryEscape(q))
	require.Equal(t, http.StatusOK, status, page)
	assert.Contains(t, page, "Read all 7 messages")
	assert.Contains(t, page, "the filter selects 7")
	assert.Regexp(t, `>4</a></td>\s*<td>charge</td><td class="err">card declined</td>`, page)
	assert.Regexp(t, `>3</a></td>\s*<td>charge</td><td class="err">order &lt;n&gt; not found</td>`, page)
	assert.Contains(t, page, "page 1 of 4")

	status, page = b.get("/poison?queue=" + url.QueryEscape(q) + "&error=not+found&page=2")
	require.Equal(t, http.StatusOK, status, page)
	assert.Contains(t, page, "the filter selects 3")
	assert.Contains(t, page, "page 2 of 2")
	assert.Contains(t, page, ">m5</a>")
	assert.NotContains(t, page, "order 1 not found")

	status, page = b.get("/poison?queue=" + url.QueryEscape(q) + "&where=tenant%3Dt0&since=2026-11-25T10:00:03Z")
	require.Equal(t, http.StatusOK, status, page)
	assert.Contains(t, page, "the filter selects 2") // m4, m6
	_, page = b.get("/poison?queue=" + url.QueryEscape(q) + "&where=tenant%3Dt1")
	assert.Contains(t, page, "the filter selects 0", "Redact hid the value")

	status, page = b.get("/poison?queue=" + url.QueryEscape(q) + "&error=(")
	assert.Equal(t, http.StatusBadRequest, status)
	assert.Contains(t, page, "error text: error parsing regexp")

	status, page = b.get("/message?queue=" + url.QueryEscape(q) + "&id=m3")
	require.Equal(t, http.StatusOK, status, page)
	assert.Contains(t, page, "order 3 not found")
	assert.Contains(t, page, "JSON, 25 bytes")
	assert.Contains(t, page, "{\n  &#34;order&#34;: 3,\n  &#34;items&#34;: [\n    1,\n    2\n  ]\n}")
	assert.Contains(t, page, "<th>tenant</th><td class=\"text\">***</td>")
	// what a reader looks for first: the attempts, counted once, and the body above the headers
	assert.Contains(t, page, "<tr><th>attempts</th><td>4</td></tr>")
	assert.NotContains(t, page, "<ol", "no list numbers the attempts")
	assert.Less(t, strings.Index(page, `<pre class="body">`), strings.Index(page, `<table class="headers">`), "the body before the headers")
	assert.Equal(t, int64(7), redacted.Load(), "each message redacted once, when the queue was read")

	status, _ = b.get("/message?queue=" + url.QueryEscape(q) + "&id=nope")
	assert.Equal(t, http.StatusNotFound, status)
	assert.Eventually(t, func() bool { return depth(t, env, topology.PoisonQueue(q)) == 7 }, testenv.Patience(), 10*time.Millisecond,
		"reading left every message in the queue")
}

// A page reads the head of a long queue alone, says so, and reuses what it read for its
// other pages and filters until it is older than SnapshotAge or "read again" is asked.
func TestPoisonPageReadsTheHead(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("head")
	poison(t, env, q, 7)
	_, b := server(t, env.URL, ui.Config{Queues: []string{q}, ScanLimit: 3, SnapshotAge: time.Hour, SampleInterval: -1}, nil)
	status, page := b.get("/poison?queue=" + url.QueryEscape(q))
	require.Equal(t, http.StatusOK, status, page)
	assert.Contains(t, page, "Read the first 3 of 7 messages")
	assert.Contains(t, page, "the filter selects 3")
	assert.Regexp(t, `>2</a></td>\s*<td>charge</td><td class="err">card declined</td>`, page)

	poison(t, env, q, 1) // not seen until read again
	_, page = b.get("/poison?queue=" + url.QueryEscape(q) + "&error=declined")
	assert.Contains(t, page, "Read the first 3 of 7 messages")
	assert.Contains(t, page, "the filter selects 2")
	_, page = b.get("/poison?queue=" + url.QueryEscape(q) + "&refresh=1")
	assert.Contains(t, page, "of 8 messages")
}

// Read-only, the default, refuses every action on the server, whatever the request holds.
func TestReadOnlyRefusesActions(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("readonly")
	poison(t, env, q, 2)
	_, b := server(t, env.URL, ui.Config{Queues: []string{q}, SampleInterval: -1}, nil)
	_, page := b.get("/poison?queue=" + url.QueryEscape(q))
	assert.NotContains(t, page, `action="/replay"`)
	assert.NotContains(t, page, `action="/delete"`)
	for _, path := range []string{"/replay", "/delete", "/kill", "/resume", "/outbox/replay"} {
		resp := b.post(path, url.Values{"queue": {q}, "confirm": {"yes"}, "csrf": {"anything"}}, "")
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, path)
		assert.Contains(t, readAll(t, resp), "read-only: actions are not enabled", path)
	}
	assert.Equal(t, 2, depth(t, env, topology.PoisonQueue(q)))
}

// An action needs the token of its browser's cookie, a request of the same origin, and
// Authorize's consent.
func TestActionsNeedCSRFOriginAndAuthorization(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("csrf")
	poison(t, env, q, 2)
	var asked []ui.Action
	var mu sync.Mutex
	srv, b := server(t, env.URL, ui.Config{Queues: []string{q}, AllowActions: true, SampleInterval: -1,
		Authorize: func(r *http.Request, a ui.Action) error {
			mu.Lock()
			asked = append(asked, a)
			mu.Unlock()
			if a == ui.ActionDelete {
				return fmt.Errorf("%s may not delete", r.RemoteAddr)
			}
			return nil
		}}, nil)
	_, page := b.get("/poison?queue=" + url.QueryEscape(q))
	tok := token(t, page)
	form := func() url.Values { return url.Values{"queue": {q}, "confirm": {"yes"}} }

	resp := b.post("/replay", form(), "")
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), "CSRF token is missing or wrong")

	// another browser's token (signed for its own cookie) is refused
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	other := &browser{t: t, base: srv.URL, c: &http.Client{Jar: jar}}
	_, otherPage := other.get("/poison?queue=" + url.QueryEscape(q))
	require.NotEqual(t, tok, token(t, otherPage))
	resp = b.post("/replay", form(), token(t, otherPage))
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)

	// a cross-site request is refused, token or not
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/replay", strings.NewReader(url.Values{"queue": {q}, "confirm": {"yes"}, "csrf": {tok}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	resp, err = b.c.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), "cross-origin")

	resp = b.post("/delete", form(), tok)
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), "may not delete")
	assert.Equal(t, 2, depth(t, env, topology.PoisonQueue(q)))
	mu.Lock()
	assert.Contains(t, asked, ui.ActionView)
	assert.Contains(t, asked, ui.ActionDelete)
	assert.NotContains(t, asked, ui.ActionReplay, "Authorize is asked after the CSRF and origin checks")
	mu.Unlock()
}

// captureLogger keeps the Info lines logged.
type captureLogger struct {
	watermill.NopLogger
	mu    sync.Mutex
	lines []watermill.LogFields
}

func (l *captureLogger) Info(msg string, fields watermill.LogFields) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, watermill.LogFields{"msg": msg}.Add(fields))
}

func (l *captureLogger) With(watermill.LogFields) watermill.LoggerAdapter { return l }

func (l *captureLogger) actions() []watermill.LogFields {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []watermill.LogFields
	for _, f := range l.lines {
		if f["msg"] == "ui: action" {
			out = append(out, f)
		}
	}
	return out
}

// waitJob follows a job's page until it says it is finished, and returns that page.
func waitJob(t *testing.T, b *browser, resp *http.Response) string {
	t.Helper()
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, readAll(t, resp))
	loc, err := resp.Location()
	require.NoError(t, err)
	var page string
	require.Eventually(t, func() bool {
		_, page = b.get(strings.TrimPrefix(loc.Path, strings.TrimPrefix(b.base, "http://"+loc.Host)))
		return strings.Contains(page, "finished")
	}, testenv.Patience(), 50*time.Millisecond)
	return page
}

// Replay one failure group and delete the other: a count first, then the confirmation, then
// the job's progress; each action leaves an audit line.
func TestReplayAndDeleteFromThePage(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("bulk")
	poison(t, env, q, 10)
	logs := &captureLogger{}
	_, b := server(t, env.URL, ui.Config{Queues: []string{q}, AllowActions: true, SampleInterval: -1, Prefix: "/ops/warren",
		User: func(*http.Request) string { return "alice" }}, logs)

	_, page := b.get("/poison?queue=" + url.QueryEscape(q) + "&error=not+found")
	tok := token(t, page)
	assert.Contains(t, page, `action="/ops/warren/replay"`)
	resp := b.post("/replay", url.Values{"queue": {q}, "error": {"not found"}}, tok)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	confirm := readAll(t, resp)
	assert.Contains(t, confirm, "The filter selects <strong>5</strong> of the 10 messages")
	assert.Equal(t, 10, depth(t, env, topology.PoisonQueue(q)), "the count moved nothing")

	page = waitJob(t, b, b.post("/replay", url.Values{"queue": {q}, "error": {"not found"}, "confirm": {"yes"}}, tok))
	assert.Regexp(t, `<th>replayed</th><td class="done">5</td>`, page)
	assert.Equal(t, 5, depth(t, env, q))
	assert.Equal(t, 5, depth(t, env, topology.PoisonQueue(q)))

	page = waitJob(t, b, b.post("/delete", url.Values{"queue": {q}, "error": {"declined"}, "confirm": {"yes"}}, tok))
	assert.Regexp(t, `<th>deleted</th><td class="done">5</td>`, page)
	assert.Equal(t, 0, depth(t, env, topology.PoisonQueue(q)))
	assert.Equal(t, 5, depth(t, env, q), "the replayed ones stay")

	var audit []string
	for _, f := range logs.actions() {
		audit = append(audit, fmt.Sprintf("%v %v %v %v", f["user"], f["action"], f["state"], f["done"]))
		assert.Equal(t, q, f["queue"])
	}
	assert.Equal(t, []string{"alice replay started <nil>", "alice replay finished 5", "alice delete started <nil>", "alice delete finished 5"}, audit)
}

// Kill and resume from the overview: the consumers' confirmations are shown, and the
// overview shows the remembered command.
func TestKillAndResume(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("kill")
	k, err := kill.NewKiller(kill.Config{Connection: env.Connection(), Wait: 200 * time.Millisecond}, nil)
	require.NoError(t, err)
	logs := &captureLogger{}
	_, b := server(t, env.URL, ui.Config{Queues: []string{q}, AllowActions: true, Killer: k, SampleInterval: -1}, logs)
	_, page := b.get("/")
	assert.Contains(t, page, `action="/kill"`)
	resp := b.post("/kill", url.Values{"queue": {q}}, token(t, page))
	body := readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, body, "the command is remembered for consumers that start later")
	_, page = b.get("/")
	assert.Regexp(t, `<td class="flag">stop (just now|\d+ s ago)</td>`, page)
	assert.Contains(t, page, `action="/resume"`)
	resp = b.post("/resume", url.Values{"queue": {q}}, token(t, page))
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	_, page = b.get("/")
	assert.Contains(t, page, `<td>resume `)
	require.Len(t, logs.actions(), 2)
	assert.Equal(t, "kill", logs.actions()[0]["action"])
	assert.Equal(t, "resume", logs.actions()[1]["action"])
}

// Mounted under a prefix, every link, form and asset starts with it.
func TestPrefix(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("prefix")
	srv, b := server(t, env.URL, ui.Config{Queues: []string{q}, Prefix: "/admin/queues", SampleInterval: -1}, nil)
	status, page := b.get("/")
	require.Equal(t, http.StatusOK, status)
	for _, m := range regexp.MustCompile(`(?:href|src|action|hx-get)="([^"#][^"]*)"`).FindAllStringSubmatch(page, -1) {
		assert.True(t, strings.HasPrefix(m[1], "/admin/queues/"), m[1])
	}
	status, css := b.get("/static/style.css")
	assert.Equal(t, http.StatusOK, status)
	assert.Contains(t, css, "svg.chart")
	resp, err := http.Get(srv.URL + "/admin/queues")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "redirected to the prefix with a slash")
	resp, err = http.Get(srv.URL + "/poison")
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusNotFound, resp.StatusCode)
}

// The topology page draws the topology and, asked, verifies the broker against it.
func TestTopologyPage(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("drawn")
	missing := env.Queue("absent")
	f := topology.File{Config: topology.Config{Delay: topology.Delay{Disabled: true}},
		Topology: topology.Topology{Queues: []topology.Queue{{Name: q}, {Name: missing}}}}
	_, b := server(t, env.URL, ui.Config{Queues: []string{q}, Topology: &f, SampleInterval: -1}, nil)
	status, page := b.get("/topology")
	require.Equal(t, http.StatusOK, status, page)
	assert.Contains(t, page, `<svg xmlns="http://www.w3.org/2000/svg" class="topology"`)
	assert.Contains(t, page, ">"+topology.PoisonQueue(missing)+"</text>")
	assert.NotContains(t, page, "<h2>Verify</h2>")
	status, page = b.get("/topology?verify=1")
	require.Equal(t, http.StatusOK, status, page)
	assert.Contains(t, page, `missing: queue &#34;`+missing+`&#34;`)
	assert.NotContains(t, page, `missing: queue &#34;`+q+`&#34;`)

	_, b2 := server(t, env.URL, ui.Config{Queues: []string{q}, SampleInterval: -1}, nil)
	status, _ = b2.get("/topology")
	assert.Equal(t, http.StatusNotFound, status)
	_, page = b2.get("/")
	assert.NotContains(t, page, `/topology"`)
}

// The parked page lists the delayed messages whose destination was gone, and replays them
// once it is back.
func TestParkedPage(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	delay := topology.Delay{Prefix: env.Name("delay"), Unit: time.Second, Radix: 4, Levels: 2}
	env.Remove(delay.Names())
	b0, err := topology.NewBuilder(topology.Config{Delay: delay}, nil)
	require.NoError(t, err)
	require.NoError(t, b0.Apply(context.Background(), env.Connection(), topology.Topology{}))
	dest := env.Queue("dest")
	for i := range 3 {
		require.NoError(t, env.Channel().PublishWithContext(context.Background(), "", delay.ParkingQueue(), false, false,
			amqp.Publishing{MessageId: "p" + strconv.Itoa(i), Body: []byte("due"), DeliveryMode: amqp.Persistent,
				Headers: amqp.Table{contract.DestQueueHeader: dest}}))
	}
	require.Eventually(t, func() bool { return depth(t, env, delay.ParkingQueue()) == 3 }, testenv.Patience(), 10*time.Millisecond)
	o, err := ops.New(ops.Config{Connection: env.Connection(), Delay: delay}, nil)
	require.NoError(t, err)
	defer o.Close()
	_, b := server(t, env.URL, ui.Config{Ops: o, Queues: []string{}, AllowActions: true, SampleInterval: -1}, nil)

	status, page := b.get("/parked")
	require.Equal(t, http.StatusOK, status, page)
	assert.Contains(t, page, "Read all 3 messages of the parking queue")
	assert.Regexp(t, `>p0</a></td>\s*<td>destination gone</td>\s*<td>`+dest+`</td>`, page)
	assert.NotContains(t, page, `action="/delete"`, "parked messages are replayed, not deleted")
	_, detail := b.get("/message?id=p1")
	assert.Contains(t, detail, "<th>destination</th><td>"+dest+"</td>")

	_, err = env.Channel().QueueDeclare(dest, true, false, false, false, nil)
	require.NoError(t, err)
	job := waitJob(t, b, b.post("/replay", url.Values{"confirm": {"yes"}}, token(t, page)))
	assert.Regexp(t, `<th>replayed</th><td class="done">3</td>`, job)
	assert.Equal(t, 3, depth(t, env, dest))
	assert.Equal(t, 0, depth(t, env, delay.ParkingQueue()))
}

// The overview says how fast each queue's depths change, from the samples it took.
func TestOverviewRates(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("rates")
	_, b := server(t, env.URL, ui.Config{Queues: []string{q}, SampleInterval: 20 * time.Millisecond}, nil)
	require.Eventually(t, func() bool {
		_, page := b.get("/")
		return strings.Contains(page, "&#43;0/min, &#43;0/min over") // html/template writes + so
	}, testenv.Patience(), 20*time.Millisecond)
	poison(t, env, q, 600)
	require.Eventually(t, func() bool {
		_, page := b.get("/")
		return regexp.MustCompile(`&#43;0/min, &#43;[1-9][0-9]*/min over`).MatchString(page)
	}, testenv.Patience(), 20*time.Millisecond, "poison rising")
}

// The page's htmx configuration is JSON that swaps a 502 in (the overview's refresh then shows
// a broker that went away) and no other error.
func TestHTMXConfig(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	_, b := server(t, env.URL, ui.Config{Queues: []string{env.Name("q")}, SampleInterval: -1}, nil)
	_, page := b.get("/")
	m := regexp.MustCompile(`<meta name="htmx-config" content='([^']*)'>`).FindStringSubmatch(page)
	require.NotNil(t, m)
	var cfg struct {
		ResponseHandling []struct {
			Code string `json:"code"`
			Swap bool   `json:"swap"`
		} `json:"responseHandling"`
	}
	require.NoError(t, json.Unmarshal([]byte(html.UnescapeString(m[1])), &cfg))
	swaps := map[string]bool{}
	for _, r := range cfg.ResponseHandling {
		if _, seen := swaps[r.Code]; !seen {
			swaps[r.Code] = r.Swap
		}
	}
	assert.Equal(t, map[string]bool{"204": false, "[23]..": true, "502": true, "[45]..": false}, swaps)
}

// The scheduled page lists what waits in the ledger, filtered; cancel takes a message off,
// and a second cancel of it says it is gone.
func TestScheduledPageListsAndCancels(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	delay := env.Delay(topology.Delay{})
	q := env.Queue("reminders")
	pub, err := dlx.NewPublisher(dlx.Config{Connection: env.Connection(), Topology: topology.Config{Delay: delay}}, nil)
	require.NoError(t, err)
	defer pub.Close()
	for _, id := range []string{"r1", "r2"} {
		msg := message.NewMessage(id, nil)
		warren.Delay(msg, time.Minute)
		warren.Schedule(msg, "")
		require.NoError(t, pub.Publish(q, msg))
	}
	o, err := ops.New(ops.Config{Connection: env.Connection(), Delay: delay}, nil)
	require.NoError(t, err)
	defer o.Close()
	logs := &captureLogger{}
	_, b := server(t, "", ui.Config{Ops: o, Queues: []string{q}, AllowActions: true, SampleInterval: -1}, logs)
	status, page := b.get("/scheduled")
	require.Equal(t, http.StatusOK, status, page)
	assert.Contains(t, page, "2 scheduled")
	assert.Contains(t, page, "<td>r1</td><td>"+q+"</td>")
	_, none := b.get("/scheduled?before=%2B30s")
	assert.Contains(t, none, "0 scheduled")

	resp := b.post("/cancel", url.Values{"id": {"r1"}}, token(t, page))
	body := readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, body, "1 scheduled")
	assert.NotContains(t, body, "<td>r1</td>")
	resp = b.post("/cancel", url.Values{"id": {"nosuch"}}, token(t, body))
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	require.Len(t, logs.actions(), 2)
	assert.Equal(t, "cancel", logs.actions()[0]["action"])
}

// Redact hides a value from everything the dashboard makes of the messages: the failure
// groups, the filters, and the count, replay and delete of what a filter selects.
func TestRedactHidesFromGroupsFiltersAndCounts(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("redact")
	poison(t, env, q, 6)
	_, b := server(t, env.URL, ui.Config{Queues: []string{q}, AllowActions: true, SampleInterval: -1,
		Redact: func(m *ops.Message) {
			m.Headers["tenant"], m.Headers[warren.PoisonErrorKey], m.Error = "***", "***", "hidden"
			for i := range m.Body { // in place: the copy's own bytes
				m.Body[i] = '*'
			}
		}}, nil)
	list := "/poison?queue=" + url.QueryEscape(q)
	status, page := b.get(list)
	require.Equal(t, http.StatusOK, status, page)
	assert.NotContains(t, page, "declined")
	assert.NotContains(t, page, "not found")
	assert.Regexp(t, `>6</a></td>\s*<td>charge</td><td class="err">hidden</td>`, page, "one group: the errors are hidden")
	group := regexp.MustCompile(`group=([0-9a-f]+)`).FindStringSubmatch(page)
	require.NotNil(t, group, page)
	tok := token(t, page)

	for filter, want := range map[string]int{"where=tenant%3Dt0": 0, "error=declined": 0, "where=tenant%3D%2A%2A%2A": 6, "group=" + group[1]: 6} {
		status, page := b.get(list + "&" + filter)
		require.Equal(t, http.StatusOK, status, page)
		assert.Contains(t, page, fmt.Sprintf("the filter selects %d.", want), filter)
	}
	_, page = b.get("/message?queue=" + url.QueryEscape(q) + "&id=m1")
	assert.NotContains(t, page, "not found")
	assert.Contains(t, page, "text, 25 bytes")
	assert.NotContains(t, page, "order")

	for _, form := range []url.Values{{"where": {"tenant=t0"}}, {"error": {"declined"}}, {"group": {group[1]}}} {
		form.Set("queue", q)
		want := 0
		if form.Has("group") {
			want = 6
		}
		resp := b.post("/delete", form, tok)
		body := readAll(t, resp)
		require.Equal(t, http.StatusOK, resp.StatusCode, body)
		assert.Contains(t, body, fmt.Sprintf("The filter selects <strong>%d</strong> of the 6 messages", want), form)
	}
	page = waitJob(t, b, b.post("/delete", url.Values{"queue": {q}, "where": {"tenant=t0"}, "confirm": {"yes"}}, tok))
	assert.Regexp(t, `<th>deleted</th><td class="done">0</td>`, page)
	page = waitJob(t, b, b.post("/replay", url.Values{"queue": {q}, "error": {"declined"}, "confirm": {"yes"}}, tok))
	assert.Regexp(t, `<th>replayed</th><td class="done">0</td>`, page)
	assert.Equal(t, 6, depth(t, env, topology.PoisonQueue(q)))
}

// Pages that read one queue at once wait for one read and share it: each sees every message.
func TestConcurrentPagesReadTheQueueOnce(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("together")
	poison(t, env, q, 500)
	var redacted atomic.Int64
	_, b := server(t, env.URL, ui.Config{Queues: []string{q}, SampleInterval: -1, SnapshotAge: time.Hour,
		Redact: func(*ops.Message) { redacted.Add(1) }}, nil)
	pages := make([]string, 4)
	errs := make([]error, len(pages))
	var wg sync.WaitGroup
	for i := range pages {
		wg.Go(func() {
			resp, err := b.c.Get(b.base + "/poison?queue=" + url.QueryEscape(q))
			if errs[i] = err; err != nil {
				return
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			pages[i], errs[i] = string(body), err
		})
	}
	wg.Wait()
	for i, page := range pages {
		require.NoError(t, errs[i])
		assert.Contains(t, page, "Read all 500 messages", i)
	}
	assert.Equal(t, int64(500), redacted.Load(), "the queue was read once")
}

// While a replay runs on a queue, its pages are refused (409) rather than read beside it;
// once it ends they read what it left.
func TestPagesOfAQueueWaitForItsJob(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("busy")
	poison(t, env, q, 4)
	_, b := server(t, env.URL, ui.Config{Queues: []string{q}, AllowActions: true, SampleInterval: -1}, nil)
	list := "/poison?queue=" + url.QueryEscape(q)
	_, page := b.get(list)
	resp := b.post("/replay", url.Values{"queue": {q}, "confirm": {"yes"}, "rate": {"2"}}, token(t, page)) // 1.5 s at least
	require.Eventually(t, func() bool {
		status, page := b.get(list)
		return status == http.StatusConflict && strings.Contains(page, "a replay or delete of this queue is under way (job 1)")
	}, testenv.Patience(), 10*time.Millisecond)
	resp2 := b.post("/delete", url.Values{"queue": {q}}, token(t, page))
	assert.Equal(t, http.StatusConflict, resp2.StatusCode, "nor is it counted")
	page = waitJob(t, b, resp)
	assert.Regexp(t, `<th>replayed</th><td class="done">4</td>`, page)
	status, page := b.get(list)
	require.Equal(t, http.StatusOK, status, page)
	assert.Contains(t, page, "Read all 0 messages")
}

// The count of a replay or delete reads the whole queue under Config.CountTimeout, not the
// page's Config.Timeout.
func TestCountHasItsOwnDeadline(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("count")
	poison(t, env, q, 3)
	for _, c := range []struct {
		count  time.Duration
		status int
		want   string
	}{
		{0, http.StatusOK, "The filter selects <strong>3</strong> of the 3 messages"},
		{time.Nanosecond, http.StatusBadGateway, "context deadline exceeded"},
	} {
		_, b := server(t, env.URL, ui.Config{Queues: []string{q}, AllowActions: true, SampleInterval: -1,
			Timeout: time.Nanosecond, CountTimeout: c.count}, nil)
		status, page := b.get("/poison?queue=" + url.QueryEscape(q))
		require.Equal(t, http.StatusBadGateway, status, "no page is read in a nanosecond")
		resp := b.post("/replay", url.Values{"queue": {q}}, token(t, page))
		body := readAll(t, resp)
		assert.Equal(t, c.status, resp.StatusCode, body)
		assert.Contains(t, body, c.want)
	}
}

// Authorize is asked first for every request: the pages, the assets, the redirect to the
// prefix, and what the ServeMux would answer itself (a redirect to the clean path, not found,
// method not allowed); the assets' directory is not listed.
func TestAuthorizeGuardsAssetsAndRedirect(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	var asked atomic.Int64
	srv, _ := server(t, env.URL, ui.Config{Queues: []string{env.Name("q")}, Prefix: "/w", SampleInterval: -1,
		Authorize: func(r *http.Request, _ ui.Action) error {
			asked.Add(1)
			if r.Header.Get("X-User") == "" {
				return errors.New("who are you?")
			}
			return nil
		}}, nil)
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path, user string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, nil)
		require.NoError(t, err)
		if user != "" {
			req.Header.Set("X-User", user)
		}
		resp, err := c.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		return resp.StatusCode, readAll(t, resp)
	}
	get := func(path, user string) (int, string) { t.Helper(); return do(http.MethodGet, path, user) }
	for _, r := range []struct{ method, path string }{
		{"GET", "/w"}, {"GET", "/w/"}, {"GET", "/w/static/style.css"}, {"GET", "/w/static/htmx.min.js"}, {"GET", "/w/static/"},
		{"GET", "/w//poison"}, {"GET", "/w/static/../poison"}, {"GET", "/w/nope"}, {"DELETE", "/w/"}, {"GET", "/elsewhere"},
	} {
		before := asked.Load()
		status, body := do(r.method, r.path, "")
		assert.Equal(t, http.StatusForbidden, status, r)
		assert.Contains(t, body, "who are you?", r)
		assert.Equal(t, before+1, asked.Load(), "asked once: %v", r)
	}
	status, _ := get("/w//poison", "ann")
	assert.Contains(t, []int{http.StatusMovedPermanently, http.StatusTemporaryRedirect}, status, "cleaned once allowed")
	status, _ = get("/w/nope", "ann")
	assert.Equal(t, http.StatusNotFound, status)
	status, _ = get("/w", "ann")
	assert.Equal(t, http.StatusMovedPermanently, status)
	status, css := get("/w/static/style.css", "ann")
	assert.Equal(t, http.StatusOK, status)
	assert.Contains(t, css, "svg.chart")
	status, body := get("/w/static/", "ann")
	assert.Equal(t, http.StatusNotFound, status)
	assert.NotContains(t, body, "style.css")
	status, _ = get("/w/static/nope.css", "ann")
	assert.Equal(t, http.StatusNotFound, status)
}

// A job is started before Close, which waits for it, or refused: none starts after it.
func TestCloseWhileJobsStart(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("closing")
	o, err := ops.New(ops.Config{Connection: env.Connection()}, nil)
	require.NoError(t, err)
	defer o.Close()
	h, err := ui.New(ui.Config{Ops: o, Queues: []string{q}, AllowActions: true, SampleInterval: -1}, nil)
	require.NoError(t, err)
	srv := httptest.NewServer(h)
	defer srv.Close()
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	b := &browser{t: t, base: srv.URL, c: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	_, page := b.get("/poison?queue=" + url.QueryEscape(q))
	form := url.Values{"queue": {q}, "confirm": {"yes"}, "csrf": {token(t, page)}}.Encode()
	codes := make([]int, 20)
	errs := make([]error, len(codes))
	var wg sync.WaitGroup
	for i := range codes {
		wg.Go(func() {
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/replay", strings.NewReader(form))
			if errs[i] = err; err != nil {
				return
			}
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			resp, err := b.c.Do(req)
			if errs[i] = err; err != nil {
				return
			}
			codes[i] = resp.StatusCode
			_ = resp.Body.Close()
		})
	}
	require.NoError(t, h.Close())
	wg.Wait()
	for i, code := range codes {
		require.NoError(t, errs[i])
		assert.Contains(t, []int{http.StatusSeeOther, http.StatusServiceUnavailable}, code)
	}
	resp := b.post("/replay", url.Values{"queue": {q}, "confirm": {"yes"}}, token(t, page))
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), "the dashboard is closing")
}

// The overview's own reads are not samples: with one sample an hour, no chart appears
// however often the page is loaded.
func TestOverviewLoadsAreNotSamples(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	_, b := server(t, env.URL, ui.Config{Queues: []string{env.WorkQueue("sampled")}, SampleInterval: time.Hour}, nil)
	for range 3 {
		status, page := b.get("/")
		require.Equal(t, http.StatusOK, status, page)
		assert.NotContains(t, page, `<svg class="chart"`)
	}
}

// The overview's poison count includes the messages that a read holds unacknowledged: with
// the management API, any reader's; without it, this dashboard's own (its pages, counts and
// jobs), whose queue then shows the count read before the read began, marked.
func TestOverviewCountsWhatIsBeingRead(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)

	q := env.WorkQueue("held")
	poison(t, env, q, 3)
	ch := env.Channel()
	require.NoError(t, ch.Qos(2, 0, false))
	_, err := ch.Consume(topology.PoisonQueue(q), "", false, false, false, false, nil) // holds 2
	require.NoError(t, err)
	require.Eventually(t, func() bool { return depth(t, env, topology.PoisonQueue(q)) == 1 }, testenv.Patience(), 10*time.Millisecond)
	o, err := ops.New(ops.Config{Connection: env.Connection(), Management: testenv.ManagementURL()}, nil)
	require.NoError(t, err)
	defer o.Close()
	_, b := server(t, "", ui.Config{Ops: o, Queues: []string{q}, SampleInterval: -1}, nil)
	var page string
	require.Eventually(t, func() bool { // the management API's statistics come every few seconds
		_, page = b.get("/")
		return strings.Contains(page, `/poison?queue=`+q+`">3</a>`)
	}, testenv.Patience(), 100*time.Millisecond, "the held ones counted")

	own := env.WorkQueue("own")
	poison(t, env, own, 4)
	_, b = server(t, env.URL, ui.Config{Queues: []string{own}, AllowActions: true, SampleInterval: -1}, nil)
	_, page = b.get("/")
	require.Contains(t, page, `/poison?queue=`+own+`">4</a></td>`)
	list := "/poison?queue=" + url.QueryEscape(own)
	_, listed := b.get(list)
	job := b.post("/replay", url.Values{"queue": {own}, "confirm": {"yes"}, "rate": {"1"}}, token(t, listed)) // 3 s at least
	require.Eventually(t, func() bool {
		status, _ := b.get(list)
		return status == http.StatusConflict && depth(t, env, topology.PoisonQueue(own)) < 4
	}, testenv.Patience(), 10*time.Millisecond, "the replay holds the queue and has taken messages")
	_, page = b.get("/")
	assert.Regexp(t, `/poison\?queue=`+regexp.QuoteMeta(own)+`">4</a> <small title="this dashboard is reading the queue: its count before the read began">\(being read\)</small>`, page)
	waitJob(t, b, job)
	_, page = b.get("/")
	assert.Contains(t, page, `/poison?queue=`+own+`">0</a></td>`)
}

// outboxRows migrates the outbox of schema, publishes n messages to topic into it (uuids
// m0, m1...) and sets the first one aside with reason, as a relay does with a message the
// broker will never take; it returns that row's id.
func outboxRows(t *testing.T, pool *pgxpool.Pool, schema, topic string, n int, reason string) int64 {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, outbox.Migrate(ctx, pool, schema))
	box, err := outbox.New(outbox.Config{Schema: schema}, nil)
	require.NoError(t, err)
	msgs := make([]*message.Message, n)
	for i := range msgs {
		msgs[i] = message.NewMessage("m"+strconv.Itoa(i), nil)
	}
	require.NoError(t, box.Publish(ctx, pool, topic, msgs...))
	var id int64
	require.NoError(t, pool.QueryRow(ctx, "UPDATE "+pgx.Identifier{schema, "outbox"}.Sanitize()+" SET set_aside = now(), reason = $1 "+
		"WHERE id = (SELECT min(id) FROM "+pgx.Identifier{schema, "outbox"}.Sanitize()+" WHERE set_aside IS NULL) RETURNING id", reason).Scan(&id))
	return id
}

// The overview shows the outbox's figures, a row set aside among the problems; the outbox
// page lists the rows set aside with their reason. A row is replayed from its form at once,
// every row once confirmed; a replay needs the CSRF token, and leaves an audit line.
func TestOutboxOverviewAndReplay(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("outbox")
	pool, schema := testenv.Postgres(t)
	id := outboxRows(t, pool, schema, "orders", 3, `NOT_FOUND - no exchange "gone" in vhost "/"`)
	logs := &captureLogger{}
	_, b := server(t, env.URL, ui.Config{Queues: []string{q}, Outbox: &ui.Outbox{DB: pool, Schema: schema},
		AllowActions: true, SampleInterval: -1}, logs)
	stats := func() outbox.Stats {
		t.Helper()
		st, err := outbox.ReadStats(context.Background(), pool, schema)
		require.NoError(t, err)
		return st
	}

	status, page := b.get("/")
	require.Equal(t, http.StatusOK, status, page)
	assert.Contains(t, page, `<a href="/outbox">Outbox</a>`)
	assert.Contains(t, page, "<h2>Outbox <small>"+schema+"</small></h2>")
	assert.Contains(t, page, "<tr><th>waiting</th><td>2 rows</td></tr>")
	assert.Contains(t, page, "<tr><th>oldest</th><td>written ")
	assert.Contains(t, page, `<tr><th>relays</th><td class="flag">none connected: nothing is published</td></tr>`)
	assert.Contains(t, page, `<tr><th>set aside</th><td class="flag"><a href="/outbox">1 row</a>`)
	assert.Contains(t, page, "<tr><th>inbox</th><td>")
	assert.Contains(t, page, `<span class="problem">outbox `+schema+`: 1 row set aside</span>`)
	assert.Contains(t, page, `<span class="problem">outbox `+schema+`: 2 rows waiting and no relay connected</span>`)

	status, page = b.get("/outbox")
	require.Equal(t, http.StatusOK, status, page)
	assert.Contains(t, page, "<title>Outbox "+schema+" · warren</title>")
	assert.Contains(t, page, fmt.Sprintf(`<tr id="row-%d"><td class="n">%d</td><td>orders</td><td>m0</td>`, id, id))
	assert.Contains(t, page, `<td class="err">NOT_FOUND - no exchange &#34;gone&#34; in vhost &#34;/&#34;</td>`)
	assert.Contains(t, page, fmt.Sprintf(`<input type="hidden" name="id" value="%d"><button>replay</button>`, id))

	tok := token(t, page) // the browser's, on every page
	one := url.Values{"id": {strconv.FormatInt(id, 10)}}
	resp := b.post("/outbox/replay", one, "")
	assert.Equal(t, http.StatusForbidden, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), "CSRF token is missing or wrong")
	assert.Equal(t, int64(1), stats().SetAside, "refused: still set aside")

	resp = b.post("/outbox/replay", one, tok)
	body := readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, body, "<h1>Replayed 1 row</h1>")
	assert.Contains(t, body, "0 rows the broker would not take")
	st := stats()
	assert.Zero(t, st.SetAside)
	assert.Equal(t, int64(3), st.Waiting, "given back to the relay")
	resp = b.post("/outbox/replay", one, tok)
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	assert.Contains(t, readAll(t, resp), "1 of the 1 rows named were not set aside")
	resp = b.post("/outbox/replay", url.Values{"id": {"x"}}, tok)
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)

	// Every row: a confirmation first.
	outboxRows(t, pool, schema, "orders", 0, "refused")
	outboxRows(t, pool, schema, "orders", 0, "refused")
	_, page = b.get("/outbox")
	assert.Contains(t, page, "<button>replay every row set aside</button>")
	resp = b.post("/outbox/replay", url.Values{}, tok)
	body = readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, body, "<h1>Confirm replay</h1>")
	assert.Contains(t, body, "<button>replay 2 rows</button>")
	assert.Equal(t, int64(2), stats().SetAside, "not before it is confirmed")
	resp = b.post("/outbox/replay", url.Values{"confirm": {"yes"}}, tok)
	body = readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	assert.Contains(t, body, "<h1>Replayed 2 rows</h1>")
	assert.Zero(t, stats().SetAside)

	actions := logs.actions()
	require.Len(t, actions, 3)
	assert.Equal(t, "replay", actions[0]["action"])
	assert.Equal(t, schema, actions[0]["outbox"])
	assert.Equal(t, fmt.Sprintf("[%d]", id), actions[0]["rows"])
	assert.Equal(t, "all", actions[2]["rows"])
	assert.Equal(t, int64(2), actions[2]["replayed"])
}

// A database that cannot be reached is said in the outbox's part of the overview, and among
// the problems; the rest of the page is shown. Without Config.Outbox there is no outbox.
func TestOutboxUnreachable(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("outbox-down")
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/postgres?sslmode=disable")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, b := server(t, env.URL, ui.Config{Queues: []string{q}, Outbox: &ui.Outbox{DB: pool}, SampleInterval: -1}, nil)
	status, page := b.get("/")
	require.Equal(t, http.StatusOK, status, page)
	assert.Contains(t, page, `<span class="problem">outbox warren: cannot read PostgreSQL</span>`)
	assert.Contains(t, page, `<h2>Outbox <small>warren</small></h2>`)
	assert.Contains(t, page, `<p class="error" role="alert">cannot read the outbox: `)
	assert.Contains(t, page, `<tr id="queue-0"`)
	status, page = b.get("/outbox")
	assert.Equal(t, http.StatusBadGateway, status)
	assert.Contains(t, page, "cannot read the outbox: ")

	_, b = server(t, env.URL, ui.Config{Queues: []string{q}, SampleInterval: -1}, nil)
	_, page = b.get("/")
	assert.NotContains(t, page, "<h2>Outbox")
	assert.NotContains(t, page, `<a href="/outbox">`)
	status, page = b.get("/outbox")
	assert.Equal(t, http.StatusNotFound, status)
	assert.Contains(t, page, "no outbox to show (ui.Config.Outbox; warren ui --postgres URL)")
}

// The held page lists a queue's held keys, and its release and skip ask for them; the
// overview links to it.
func TestHeldPageListsAndActs(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	q := env.WorkQueue("orders")
	env.Remove([]string{topology.HeldState(q)}, nil)
	conn, err := env.Dial()
	require.NoError(t, err)
	defer conn.Close()
	_, err = held.Update(context.Background(), conn, q, func(st *held.State) bool {
		for _, k := range []string{"order-1", "order-2"} {
			st.Keys[k] = held.Entry{Key: k, Lane: topology.LaneQueue(q, 0), Since: time.Now(), MessageID: k + "/0", Error: "card declined"}
		}
		return true
	})
	require.NoError(t, err)
	o, err := ops.New(ops.Config{Connection: env.Connection()}, nil)
	require.NoError(t, err)
	defer o.Close()
	logs := &captureLogger{}
	_, b := server(t, "", ui.Config{Ops: o, Queues: []string{q}, AllowActions: true, SampleInterval: -1}, logs)
	_, overview := b.get("/")
	assert.Contains(t, overview, "2 held keys (warren held list "+q+")", "a problem")
	assert.Contains(t, overview, `href="/held?queue=`+q+`">2 held keys</a>`, "a link in the queue's row")
	status, page := b.get("/held?queue=" + url.QueryEscape(q))
	require.Equal(t, http.StatusOK, status, page)
	assert.Contains(t, page, "2 held.")
	assert.Contains(t, page, "<td>order-1</td>")

	resp := b.post("/held/release", url.Values{"queue": {q}, "key": {"order-1"}}, token(t, page))
	body := readAll(t, resp)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	resp = b.post("/held/skip", url.Values{"queue": {q}, "key": {"order-2"}}, token(t, body))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	resp = b.post("/held/skip", url.Values{"queue": {q}, "key": {"nosuch"}}, token(t, body))
	assert.Equal(t, http.StatusConflict, resp.StatusCode)
	keys, err := o.Held(context.Background(), q)
	require.NoError(t, err)
	require.Len(t, keys, 2)
	assert.Equal(t, []string{"release", "skip"}, []string{keys[0].Action, keys[1].Action})
	require.Len(t, logs.actions(), 3)
	assert.Equal(t, "release", logs.actions()[0]["action"])
}
