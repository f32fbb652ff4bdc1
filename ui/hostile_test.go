package ui_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/dlx"
	"github.com/warrenmq/warren/internal/contract"
	"github.com/warrenmq/warren/internal/testenv"
	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/ledger"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
	"github.com/warrenmq/warren/ui"
)

// What the hostile values hold: control characters a terminal or a page acts on (ESC, BEL,
// NUL, DEL, CSI), markup, and bytes that are not UTF-8.
const (
	controls = "\x1b[2J\x07\x00\x7f\u009b"
	markup   = `"><script>alert(1)</script><img src=x onerror=alert(2)>`
	notUTF8  = "\xff\xfe"
)

// The ids whose bytes a page must carry through its links and forms, each with a twin that
// differs only in those bytes: U+FFFD, what a browser or html/template makes of them.
var (
	idNUL      = "id\x00nul"
	twinNUL    = "id\uFFFDnul"
	idByte     = "id\xffbyte"
	twinByte   = "id\uFFFDbyte"
	idHostile  = "id" + controls + markup + notUTF8 + "\r\n"
	idLong     = strings.Repeat("long\x00\xff", 60) // past a message-id's 255 bytes: the Marshaler's header carries it
	schedNUL   = "s\x00nul"
	schedTwinN = "s\uFFFDnul"
	schedByte  = "s\xffbyte"
	schedTwinB = "s\uFFFDbyte"
	schedHost  = "s" + controls + markup
)

// hostileEnv is a throwaway node with hostile values everywhere a page shows one: a work
// queue and its poison messages, parked messages, scheduled messages, a topology.
type hostileEnv struct {
	env      *testenv.Env
	node     *testenv.Node
	queue    string // the work queue, its name hostile
	missing  string // a work queue that does not exist, its name hostile
	dest     string // the destination of the scheduled messages, its name hostile
	delay    topology.Delay
	topology topology.File
	pool     *pgxpool.Pool // the outbox's database
	schema   string        // the outbox's schema
	setAside int64         // the outbox row set aside, its topic, uuid and reason hostile
}

func newHostileEnv(t *testing.T) *hostileEnv {
	t.Helper()
	node := testenv.StartNode(t)
	env := testenv.NewAt(t, node.URL())
	e := &hostileEnv{env: env, node: node, queue: env.WorkQueue("q" + controls + markup),
		missing: env.Name("missing" + controls + markup), dest: env.WorkQueue("dest" + controls + markup),
		delay: env.Delay(topology.Delay{})}
	e.topology = topology.File{Config: topology.Config{Delay: topology.Delay{Disabled: true}},
		Topology: topology.Topology{Queues: []topology.Queue{{Name: e.queue}, {Name: e.missing}}}}

	ctx := context.Background()
	ch := env.Channel()
	require.NoError(t, ch.Confirm(false))
	publish := func(queue string, p amqp.Publishing) {
		t.Helper()
		p.DeliveryMode = amqp.Persistent
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, p)
		require.NoError(t, err)
		ok, err := dc.WaitContext(ctx)
		require.NoError(t, err)
		require.True(t, ok)
	}
	// Poison messages as the Poison middleware writes them, through the Marshaler (which
	// carries an id past 255 bytes in a header); which says which one a page shows.
	for i, id := range []string{idNUL, twinNUL, idByte, twinByte, idHostile, idLong} {
		msg := message.NewMessage(id, []byte(`{"which":`+fmt.Sprint(i)+`}`))
		msg.Metadata.Set(warren.PoisonReasonKey, warren.PoisonReasonExhausted+controls)
		msg.Metadata.Set(warren.PoisonErrorKey, "failed: "+controls+markup+notUTF8)
		msg.Metadata.Set(warren.PoisonErrorTypeKey, "*errors."+controls+markup)
		msg.Metadata.Set(warren.PoisonHandlerKey, "charge"+controls+markup)
		msg.Metadata.Set(warren.PoisonQueueKey, e.queue)
		msg.Metadata.Set(warren.PoisonAttemptsKey, "4")
		msg.Metadata.Set(warren.PoisonTraceIDKey, "trace"+controls)
		msg.Metadata.Set("which", fmt.Sprint(i))
		msg.Metadata.Set("x-evil"+controls+markup, controls+markup+notUTF8)
		p, err := warren.Marshaler{}.Marshal(msg)
		require.NoError(t, err)
		p.ContentType = "text/" + controls + markup
		if id == idHostile {
			p.Body = []byte(notUTF8 + markup)
			// (a table's strings are shown as JSON, which has no bytes that are not UTF-8)
			p.Headers["x-death"] = []any{amqp.Table{"queue": e.queue + controls, "reason": "rejected" + markup,
				"count": int64(2), "time": time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)}}
		}
		publish(topology.PoisonQueue(e.queue), p)
	}
	// Scheduled messages, a minute ahead (listed until a warren consumer takes them: none does).
	pub, err := dlx.NewPublisher(dlx.Config{Connection: env.Connection(), Topology: topology.Config{Delay: e.delay}}, nil)
	require.NoError(t, err)
	defer pub.Close()
	for _, id := range []string{schedNUL, schedTwinN, schedByte, schedTwinB, schedHost} {
		msg := message.NewMessage(id, []byte("later"))
		warren.Delay(msg, time.Minute)
		warren.Schedule(msg, id)
		require.NoError(t, pub.Publish(e.dest, msg))
	}
	// An outbox row set aside, its topic and uuid any bytes, its reason (text: no NUL, UTF-8)
	// markup and controls, as a broker's refusal may quote what it was sent.
	e.pool, e.schema = testenv.Postgres(t)
	e.setAside = outboxRows(t, e.pool, e.schema, "orders"+controls+markup+notUTF8, 1, "refused: \x1b[2J\x07"+markup)
	_, err = e.pool.Exec(ctx, "UPDATE "+pgx.Identifier{e.schema, "outbox"}.Sanitize()+" SET uuid = $1", []byte(idHostile))
	require.NoError(t, err)
	// Parked messages: delayed ones whose destination was gone (the publisher declared the
	// parking queue).
	for _, id := range []string{idNUL, idHostile} {
		publish(e.delay.ParkingQueue(), amqp.Publishing{MessageId: id, Body: []byte(controls + markup),
			Headers: amqp.Table{contract.DestQueueHeader: "gone" + controls + markup}})
	}
	return e
}

// serve serves a Handler of the node with actions, a Killer and the topology.
func (e *hostileEnv) serve(t *testing.T) (*browser, *ops.Ops) {
	t.Helper()
	o, err := ops.New(ops.Config{Connection: e.env.Connection(), Delay: e.delay}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = o.Close() })
	k, err := kill.NewKiller(kill.Config{Connection: e.env.Connection(), Wait: 100 * time.Millisecond}, nil)
	require.NoError(t, err)
	_, b := server(t, "", ui.Config{Ops: o, Killer: k, Queues: []string{e.queue, e.missing}, Topology: &e.topology,
		Outbox: &ui.Outbox{DB: e.pool, Schema: e.schema}, AllowActions: true, SampleInterval: 20 * time.Millisecond}, nil)
	return b, o
}

// unseen lists what in page a reader would not see as it was written: a control character
// but newline and tab (C0, DEL, C1), a byte that is not UTF-8, and U+FFFD (what a browser
// makes of such a byte, and html/template of NUL: no hostile value holds one).
func unseen(page string) []string {
	var found []string
	for i := 0; i < len(page); {
		r, n := utf8.DecodeRuneInString(page[i:])
		if r == utf8.RuneError || r < 0x20 && r != '\n' && r != '\t' || r >= 0x7f && r <= 0x9f {
			found = append(found, fmt.Sprintf("%q at %d in %q", page[i:i+n], i, page[max(i-60, 0):min(i+60, len(page))]))
		}
		i += n
	}
	return found
}

// Every page shows every value read from the broker, and every value of a request, written
// out: no control character, byte that is not UTF-8 or markup of theirs reaches the response,
// in the title, the text, a link, an attribute or a form field. On a node of its own: no
// hostile message goes to the shared broker.
//
// Then the ids that hold NUL or a byte that is not UTF-8 go through the pages in Chromium: a
// message is opened from its link and replayed from its page's form, and a scheduled message
// is cancelled from its form, by their exact bytes; their twins, which differ only in those
// bytes, are left alone.
func TestHostileValues(t *testing.T) {
	t.Parallel()
	e := newHostileEnv(t)
	t.Run("every page written out", func(t *testing.T) { hostilePages(t, e) })
	t.Run("ids round-trip in Chromium", func(t *testing.T) { hostileIDsRoundTrip(t, e) })
}

func hostilePages(t *testing.T, e *hostileEnv) {
	b, _ := e.serve(t)
	q, qs := e.queue, url.QueryEscape(e.queue)
	twins := strings.NewReplacer(twinNUL, "", twinByte, "", schedTwinN, "", schedTwinB, "") // hold U+FFFD themselves
	check := func(what string, status int, page string) {
		t.Helper()
		assert.Empty(t, unseen(twins.Replace(page)), what)
		for _, raw := range []string{"<script>", "<img", "onerror=alert(2)>"} {
			assert.NotContains(t, page, raw, what)
		}
		assert.NotZero(t, status, what)
	}
	get := func(path string, want int) string {
		t.Helper()
		status, page := b.get(path)
		assert.Equal(t, want, status, path)
		check("GET "+path, status, page)
		return page
	}
	post := func(path string, form url.Values, tok string, want int) *http.Response {
		t.Helper()
		resp := b.post(path, form, tok)
		if resp.StatusCode == http.StatusSeeOther {
			return resp
		}
		page := readAll(t, resp)
		assert.Equal(t, want, resp.StatusCode, "POST %s %v: %s", path, form, page)
		check(fmt.Sprintf("POST %s %v", path, form), resp.StatusCode, page)
		return resp
	}

	require.Eventually(t, func() bool { // the charts once sampled: every part of the overview
		_, page := b.get("/")
		return strings.Contains(page, `<svg class="chart"`)
	}, testenv.Patience(), 20*time.Millisecond)
	overview := get("/", http.StatusOK)
	assert.Contains(t, overview, `<p id="problems" class="problems"`)
	assert.Contains(t, overview, `\x1b[2J\x07\x00\u007f\u009b&#34;&gt;&lt;script&gt;`, "the queue's name, written out")
	list := get("/poison?queue="+qs, http.StatusOK)
	assert.Contains(t, list, "Read all 6 messages")
	get("/poison?queue="+qs+"&error="+url.QueryEscape(controls+"("), http.StatusBadRequest)
	get("/poison?queue="+qs+"&handler="+url.QueryEscape("charge"+controls+markup)+"&id="+url.QueryEscape(idHostile)+
		"&where="+url.QueryEscape("which="+controls)+"&since="+url.QueryEscape(controls), http.StatusBadRequest)
	filtered := get("/poison?queue="+qs+"&handler="+url.QueryEscape("charge"+controls+markup)+"&id="+url.QueryEscape(idHostile), http.StatusOK)
	assert.Contains(t, filtered, "the filter selects 1.")
	for _, id := range []string{idNUL, twinNUL, idByte, twinByte, idHostile, idLong} {
		page := get("/message?queue="+qs+"&id="+url.QueryEscape(id), http.StatusOK)
		assert.Contains(t, page, "<th>which</th>", id)
	}
	detail := get("/message?queue="+qs+"&id="+url.QueryEscape(idHostile), http.StatusOK)
	assert.Contains(t, detail, `<title>Message id\x1b[2J\x07\x00\u007f\u009b&#34;&gt;&lt;script&gt;alert(1)&lt;/script&gt;`)
	assert.Contains(t, detail, fmt.Sprintf("binary, %d bytes", len(notUTF8+markup)))
	assert.Contains(t, detail, "ff fe 22 3e 3c 73 63 72  69 70 74 3e 61 6c 65 72", "the body, not UTF-8, as a hex dump")
	assert.Contains(t, detail, "dead-lettered")
	get("/message?queue="+qs+"&id="+url.QueryEscape("nosuch"+controls+notUTF8), http.StatusNotFound)
	get("/parked", http.StatusOK)
	get("/message?id="+url.QueryEscape(idHostile), http.StatusOK)
	get("/scheduled", http.StatusOK)
	get("/scheduled?topic="+url.QueryEscape(controls+markup)+"&before="+url.QueryEscape(controls+notUTF8), http.StatusBadRequest)
	get("/topology", http.StatusOK)
	get("/topology?verify=1", http.StatusOK)
	get("/jobs/"+url.PathEscape(controls+markup), http.StatusNotFound)
	box := get("/outbox", http.StatusOK)
	assert.Contains(t, box, `<td class="err">refused: \x1b[2J\x07&#34;&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=alert(2)&gt;</td>`,
		"the reason, written out and escaped")
	assert.Contains(t, box, `<td>orders\x1b[2J\x07\x00\u007f\u009b&#34;&gt;&lt;script&gt;`, "the topic, written out")
	assert.Contains(t, overview, "1 row set aside")

	tok := token(t, overview)
	exact := func(v url.Values) url.Values { // as the pages' forms send a value that is not plain
		out := url.Values{}
		for k, vs := range v {
			for _, s := range vs {
				out.Add(k+".b64", base64URL(s))
			}
		}
		return out
	}
	post("/replay", exact(url.Values{"queue": {q}, "id": {idHostile}, "to": {"nowhere" + controls + markup}, "handler": {"charge" + controls + markup}}), tok, http.StatusOK)
	post("/delete", url.Values{"queue": {q}, "id": {idHostile}, "error": {"failed: \x1b"}}, tok, http.StatusOK)
	post("/replay", url.Values{"queue.b64": {"not base64!"}}, tok, http.StatusBadRequest)
	job := post("/replay", exact(url.Values{"queue": {q}, "id": {idHostile}, "to": {"nowhere" + controls + markup}, "confirm": {"yes"}}), tok, 0)
	require.Equal(t, http.StatusSeeOther, job.StatusCode)
	page := waitJob(t, b, job)
	check("the job", http.StatusOK, page)
	assert.Contains(t, page, `<th>replayed</th><td class="done">0</td>`)
	loc, err := job.Location()
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodGet, b.base+loc.Path, nil)
	require.NoError(t, err)
	req.Header.Set("HX-Request", "true")
	resp, err := b.c.Do(req)
	require.NoError(t, err)
	check("the job's progress", resp.StatusCode, readAll(t, resp))
	_ = resp.Body.Close()

	post("/kill", url.Values{"queue": {q}}, tok, http.StatusOK)
	killed := get("/", http.StatusOK)
	assert.Contains(t, killed, "killed (stop)")
	post("/resume", exact(url.Values{"queue": {q}}), tok, http.StatusOK)
	post("/kill", url.Values{"queue": {e.missing}}, tok, http.StatusBadGateway)
	post("/cancel", exact(url.Values{"id": {schedHost}}), tok, http.StatusOK)
	post("/cancel", url.Values{"id": {"nosuch" + controls + notUTF8}}, tok, http.StatusConflict)
	post("/outbox/replay", url.Values{"id": {controls + markup + notUTF8}}, tok, http.StatusBadRequest)
	post("/outbox/replay", exact(url.Values{"id": {controls + markup + notUTF8}}), tok, http.StatusBadRequest)
	post("/outbox/replay", url.Values{}, tok, http.StatusOK) // the confirmation
	post("/outbox/replay", url.Values{"id": {fmt.Sprint(e.setAside)}}, tok, http.StatusOK)
	post("/outbox/replay", url.Values{"id": {fmt.Sprint(e.setAside)}}, tok, http.StatusConflict)
}

// base64URL is what the pages write in a form field NAME.b64.
func base64URL(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func hostileIDsRoundTrip(t *testing.T, e *hostileEnv) {
	ctx := chromium(t)
	b, o := e.serve(t)
	base := b.base
	list := base + "/poison?queue=" + url.QueryEscape(e.queue)

	// From the list, open the message by its link, and replay it from its page.
	for _, c := range []struct{ id, twin, shown string }{
		{idNUL, twinNUL, `id\x00nul`},
		{idByte, twinByte, `id\xffbyte`},
	} {
		step(ctx, t, "open "+c.shown, chromedp.Navigate(list),
			chromedp.Click(`//table[contains(@class,"messages")]//a[.="`+c.shown+`"]`),
			chromedp.WaitVisible(`pre.body`))
		require.Equal(t, "Message "+c.shown, read(ctx, t, "title", `h1`))
		require.Equal(t, c.shown, read(ctx, t, "id", `//table[contains(@class,"detail")]//tr[th="id"]/td`))
		step(ctx, t, "replay "+c.shown,
			chromedp.Click(`//button[contains(., "replay this message")]`),
			chromedp.WaitVisible(`//p[contains(., "selects 1 of the")]`),
			chromedp.Click(`//button[contains(., "replay 1 messages")]`),
			chromedp.WaitVisible(`//div[@id="job"]//p[contains(., "finished")]`))
		require.Equal(t, "1", read(ctx, t, "replayed", `//div[@id="job"]//td[@class="done"]`))
		got := e.takeIDs(t, e.queue)
		require.Equal(t, []string{c.id}, got, "replayed by its exact bytes")
		left, err := o.Poisoned(context.Background(), e.queue, ops.Browse{Filter: ops.Filter{IDs: []string{c.id, c.twin}}})
		require.NoError(t, err)
		require.Len(t, left, 1)
		require.Equal(t, c.twin, left[0].ID, "its twin stays")
	}

	// The long id, carried in a header: opened from its link.
	step(ctx, t, "open the long id", chromedp.Navigate(list),
		chromedp.Click(`//table[contains(@class,"messages")]//a[starts-with(., "long\x00\xff")]`),
		chromedp.WaitVisible(`pre.body`))
	require.Contains(t, read(ctx, t, "body", `pre.body`), `"which": 5`)

	// Cancel from the Scheduled page's form, by the exact bytes of the id.
	for _, c := range []struct{ id, twin, shown string }{
		{schedNUL, schedTwinN, `s\x00nul`},
		{schedByte, schedTwinB, `s\xffbyte`},
	} {
		step(ctx, t, "scheduled", chromedp.Navigate(base+"/scheduled"), chromedp.WaitVisible(`table.scheduled`))
		require.Contains(t, read(ctx, t, "scheduled", `table.scheduled`), c.shown,
			"listed by its exact bytes: the ledger must keep them (package ledger)")
		step(ctx, t, "cancel "+c.shown,
			chromedp.Click(`//table[contains(@class,"scheduled")]//tr[td[1]="`+c.shown+`"]//button[.="cancel"]`),
			chromedp.WaitVisible(`//h1[starts-with(., "Cancelled")]`))
		require.Equal(t, "Cancelled "+c.shown, read(ctx, t, "title", `h1`))
		entries, err := o.Scheduled(context.Background(), ledger.Filter{})
		require.NoError(t, err)
		var ids []string
		for _, en := range entries {
			ids = append(ids, en.ID)
		}
		assert.NotContains(t, ids, c.id, "cancelled by its exact bytes")
		assert.Contains(t, ids, c.twin, "its twin is still scheduled")
	}
}

// takeIDs takes every message of queue and returns their ids.
func (e *hostileEnv) takeIDs(t *testing.T, queue string) []string {
	t.Helper()
	ch := e.env.Channel()
	var ids []string
	for {
		d, ok, err := ch.Get(queue, true)
		require.NoError(t, err)
		if !ok {
			return ids
		}
		ids = append(ids, contract.DeliveryID(d))
	}
}
