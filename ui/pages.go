package ui

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/warrenmq/warren"
	"github.com/warrenmq/warren/internal/visible"
	"github.com/warrenmq/warren/internal/when"
	"github.com/warrenmq/warren/ledger"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/topology"
)

// parsePages parses each page's template with the layout.
func parsePages(funcs template.FuncMap) (map[string]*template.Template, error) {
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		if n == "templates/layout.html" {
			continue
		}
		t, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("ui: %w", err)
		}
		pages[strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")] = t
	}
	return pages, nil
}

func (h *Handler) funcs() template.FuncMap {
	return template.FuncMap{
		// vis shows the characters a reader could not see (control characters, bytes that
		// are not UTF-8) written out; html/template escapes the rest.
		"vis": visible.String,
		// fieldName and fieldValue are a form field's name and value that carry a value
		// exactly (see exactSuffix).
		"fieldName":  fieldName,
		"fieldValue": fieldValue,
		"ago":        func(t time.Time) string { return ago(t, time.Now()) },
		"human":      human,
		"count":      count,
		"count64":    func(n int64) string { return count(int(n)) },
		"at": func(t time.Time) string {
			if t.IsZero() {
				return "-"
			}
			return t.UTC().Format("2006-01-02 15:04:05.000Z")
		},
		"chart":  func(name string) template.HTML { return h.samples.chart(name, time.Now()) },
		"delays": func() string { return delaysSeries },
		"rates":  func(name string) string { return h.samples.rates(name, time.Now()) },
		// set returns the query of v with k set to val (encoded: a query, not a page's text).
		"set": func(v url.Values, k, val string) template.URL {
			c := url.Values{}
			for key, vs := range v {
				c[key] = vs
			}
			c.Set(k, val)
			return template.URL(c.Encode()) //nolint:gosec // percent-encoded
		},
		"add": func(a, b int) int { return a + b },
	}
}

// overviewData is the overview page.
type overviewData struct {
	Status ops.Status
	Stale  bool   // the broker could not be read: Status is the last one that could
	Err    string // why it could not
	// Problems are what Status.Problems finds, the problems of one work queue on one line,
	// in its order; those of the delay levels and the broker follow, one each.
	Problems []problemLine
	Rows     []queueRow // Status.Queues with their problems
	// ParkedNote says why the parked count is not AMQP's (see Handler.counted); "" if it is.
	ParkedNote string
	// Outbox is the outbox's figures (Config.Outbox); nil without one.
	Outbox *outboxData
}

// withOutbox adds the outbox read, and its problems, to d.
func (d overviewData) withOutbox(box *outboxData) overviewData {
	d.Outbox = box
	if box != nil {
		for _, text := range box.problems() {
			d.Problems = append(d.Problems, problemLine{Row: -1, Texts: []string{text}})
		}
	}
	return d
}

// problemLine is what is wrong with one work queue, or one other problem (Queue "").
type problemLine struct {
	Queue string
	Row   int // the queue's row (its id is "queue-Row"), -1 for another problem
	Texts []string
}

// queueRow is a work queue of the overview, with its problems by kind (ops.Problem*).
type queueRow struct {
	ops.QueueStatus
	Row       int
	Problems  map[string]bool
	CountNote string // why the poison count is not AMQP's (see Handler.counted)
}

// Problem reports whether the row has a problem of one of kinds.
func (q queueRow) Problem(kinds ...string) bool {
	for _, k := range kinds {
		if q.Problems[k] {
			return true
		}
	}
	return false
}

// Class is the row's HTML class: "down" for a queue missing or down, "problem" for one with
// a problem, both, or "".
func (q queueRow) Class() string {
	var c []string
	if !q.Exists || q.Unavailable() {
		c = append(c, "down")
	}
	if len(q.Problems) > 0 {
		c = append(c, "problem")
	}
	return strings.Join(c, " ")
}

// newOverview returns the overview of st; notes are Handler.counted's.
func newOverview(st ops.Status, notes map[string]string) overviewData {
	d := overviewData{Status: st, ParkedNote: notes[""]}
	row := map[string]int{}
	for i, q := range st.Queues {
		row[q.Queue] = i
		d.Rows = append(d.Rows, queueRow{QueueStatus: q, Row: i, Problems: map[string]bool{}, CountNote: notes[q.Queue]})
	}
	line := map[string]int{} // work queue → its line in d.Problems
	for _, p := range st.Problems() {
		i, isRow := row[p.Queue]
		if p.Queue == "" || !isRow {
			d.Problems = append(d.Problems, problemLine{Queue: p.Queue, Row: -1, Texts: []string{p.Text}})
			continue
		}
		d.Rows[i].Problems[p.Kind] = true
		l, ok := line[p.Queue]
		if !ok {
			l = len(d.Problems)
			line[p.Queue] = l
			d.Problems = append(d.Problems, problemLine{Queue: p.Queue, Row: i})
		}
		d.Problems[l].Texts = append(d.Problems[l].Texts, p.Text)
	}
	return d
}

func (h *Handler) overview(r *http.Request, _ url.Values, p *page) (string, int) {
	p.Title = "Overview"
	ctx, cancel := h.callCtx(r)
	defer cancel()
	st, err := h.status(ctx)
	box := h.readOutbox(r, false)
	if err != nil { // said inside the part that the page's refresh swaps in
		last := h.samples.lastStatus()
		d := newOverview(last, nil).withOutbox(box)
		d.Stale, d.Err = !last.At.IsZero(), "cannot read the broker: "+err.Error()
		p.Data = d
		return "overview", http.StatusBadGateway
	}
	st, notes := h.counted(st)
	h.samples.remember(st)
	p.Data = newOverview(st, notes).withOutbox(box)
	return "overview", http.StatusOK
}

// listData is the poison and parked pages.
type listData struct {
	Queue   string // the work queue; "" for the parked messages
	Scanned int    // messages read
	Depth   int    // messages in the queue (-1 if not known)
	ReadAt  time.Time
	Groups  []ops.FailureGroup
	Form    url.Values // the filter, as the request gave it
	Matches int        // messages the filter selects
	Shown   []ops.Message
	Page    int // from 1
	Pages   int
}

func (h *Handler) poison(r *http.Request, v url.Values, p *page) (string, int) {
	queue := v.Get("queue")
	p.Title = "Poison " + queue
	return h.list(r, v, p, queue)
}

func (h *Handler) parked(r *http.Request, v url.Values, p *page) (string, int) {
	p.Title = "Parked"
	return h.list(r, v, p, "")
}

// list reads the head of the poison queue of queue (the parking queue for ""), or takes the
// snapshot of a read that is young enough (see read), groups its failures and shows one page
// of what the request's filter selects.
func (h *Handler) list(r *http.Request, v url.Values, p *page, queue string) (string, int) {
	d := listData{Queue: queue, Form: filterForm(v), Page: 1, Pages: 1}
	p.Data = &d
	f, err := filterOf(v, time.Now())
	if err != nil {
		p.Error = err.Error()
		return "list", http.StatusBadRequest
	}
	ctx, cancel := h.callCtx(r)
	defer cancel()
	snap, err := h.read(ctx, queue, v.Get("refresh") != "")
	if err != nil {
		p.Error = "cannot read the queue: " + err.Error()
		return "list", readStatus(err)
	}
	all := snap.msgs
	d.Depth, d.ReadAt = snap.depth, snap.at
	d.Scanned = len(all)
	if queue != "" {
		d.Groups = ops.Group(all)
	}
	var sel []ops.Message
	for _, m := range all {
		if f.Match(m) {
			sel = append(sel, m)
		}
	}
	d.Matches = len(sel)
	d.Pages = max(1, (len(sel)+h.cfg.PageSize-1)/h.cfg.PageSize)
	if n, err := strconv.Atoi(v.Get("page")); err == nil {
		d.Page = min(max(n, 1), d.Pages)
	}
	d.Shown = sel[min((d.Page-1)*h.cfg.PageSize, len(sel)):min(d.Page*h.cfg.PageSize, len(sel))]
	return "list", http.StatusOK
}

// readStatus is the status of a page whose read of a queue failed with err: 409 while a job
// holds the queue, else 502.
func readStatus(err error) int {
	if errors.Is(err, errJobRuns) {
		return http.StatusConflict
	}
	return http.StatusBadGateway
}

// filterFields are the form fields of a filter.
var filterFields = []string{"group", "reason", "handler", "error", "where", "since", "until", "id"}

// filterForm returns the filter fields of a request's form (see form), and its queue: the
// typed ones trimmed of spaces, an id exactly as it is.
func filterForm(form url.Values) url.Values {
	v := url.Values{}
	for _, k := range filterFields {
		for _, s := range form[k] {
			if k != "id" {
				s = strings.TrimSpace(s)
			}
			if s != "" {
				v.Add(k, s)
			}
		}
	}
	if q := form.Get("queue"); q != "" {
		v.Set("queue", q)
	}
	return v
}

// filterOf reads the filter of a request's form (see form); an error names the field.
func filterOf(form url.Values, now time.Time) (ops.Filter, error) {
	v := filterForm(form)
	f := ops.Filter{IDs: v["id"], Group: v.Get("group"), Reason: v.Get("reason"), Handler: v.Get("handler")}
	var err error
	if s := v.Get("error"); s != "" {
		if f.Error, err = regexp.Compile(s); err != nil {
			return f, fmt.Errorf("error text: %w", err)
		}
	}
	if f.Since, err = when.AgoIfSet(v.Get("since"), now); err != nil {
		return f, fmt.Errorf("since: %w", err)
	}
	if f.Until, err = when.AgoIfSet(v.Get("until"), now); err != nil {
		return f, fmt.Errorf("until: %w", err)
	}
	for _, w := range v["where"] {
		for _, line := range strings.Split(w, "\n") {
			if line = strings.TrimSpace(line); line == "" {
				continue
			}
			k, val, ok := strings.Cut(line, "=")
			if !ok || k == "" {
				return f, fmt.Errorf("header %q: want name=value", line)
			}
			if f.Headers == nil {
				f.Headers = map[string]string{}
			}
			f.Headers[k] = val
		}
	}
	return f, nil
}

// messageData is a message's detail page.
type messageData struct {
	Queue    string // "" for a parked message
	M        ops.Message
	Headers  [][2]string // sorted by name
	Deaths   []map[string]string
	Body     string // pretty-printed JSON, text, or a hex dump
	BodyKind string // "JSON", "text" or "binary"
}

func (h *Handler) message(r *http.Request, v url.Values, p *page) (string, int) {
	queue, id := v.Get("queue"), v.Get("id")
	p.Title = "Message " + id
	ctx, cancel := h.callCtx(r)
	defer cancel()
	m, status, err := h.find(ctx, queue, id)
	if err != nil {
		p.Error = err.Error()
		return "message", status
	}
	d := messageData{Queue: queue, M: m}
	for k, v := range m.Headers {
		d.Headers = append(d.Headers, [2]string{k, v})
	}
	slices.SortFunc(d.Headers, func(a, b [2]string) int { return strings.Compare(a[0], b[0]) })
	d.Deaths = deaths(m.Headers[warren.XDeathHeader])
	d.BodyKind, d.Body = showBody(m.Body)
	p.Data = d
	return "message", http.StatusOK
}

// find returns the message of id in the poison queue of queue (the parking queue for ""),
// redacted: from the snapshot if it is there, else looked for in the whole queue. The error
// comes with the page's status.
func (h *Handler) find(ctx context.Context, queue, id string) (ops.Message, int, error) {
	if snap, ok := h.reads.get(queue); ok {
		for _, m := range snap.msgs {
			if m.ID == id {
				return m, http.StatusOK, nil // redacted when it was read
			}
		}
	}
	ms, err := h.browseAlone(ctx, queue, ops.Browse{Filter: ops.Filter{IDs: []string{id}}, Limit: 1, Bodies: true})
	if err != nil {
		return ops.Message{}, readStatus(err), fmt.Errorf("cannot read the queue: %w", err)
	}
	if len(ms) == 0 {
		return ops.Message{}, http.StatusNotFound, errors.New("no message with this id in the queue (replayed or deleted since?)")
	}
	return h.redacted(ms[0]), http.StatusOK, nil
}

// deaths reads the x-death header (as ops shows it, JSON) into one map per entry, each value
// a string; nil if it is absent or not readable.
func deaths(s string) []map[string]string {
	var raw []map[string]any
	if s == "" || json.Unmarshal([]byte(s), &raw) != nil {
		return nil
	}
	out := make([]map[string]string, len(raw))
	for i, e := range raw {
		out[i] = map[string]string{}
		for k, v := range e {
			if b, err := json.Marshal(v); err == nil {
				out[i][k] = strings.Trim(string(b), `"`)
			}
		}
	}
	return out
}

// showBody returns body as the page shows it: indented if it is JSON, as text if it is
// UTF-8, else as a hex dump.
func showBody(body []byte) (kind, shown string) {
	var b bytes.Buffer
	if json.Valid(body) && len(body) > 0 && json.Indent(&b, body, "", "  ") == nil {
		return "JSON", b.String()
	}
	if utf8.Valid(body) {
		return "text", string(body)
	}
	return "binary", hex.Dump(body)
}

// topologyData is the topology page.
type topologyData struct {
	SVG    template.HTML // topology.SVG escapes every name
	Verify bool          // asked for
	Report topology.Report
}

func (h *Handler) topology(r *http.Request, v url.Values, p *page) (string, int) {
	p.Title = "Topology"
	if h.cfg.Topology == nil {
		p.Error = "no topology to draw (ui.Config.Topology; warren ui --config FILE)"
		return "topology", http.StatusNotFound
	}
	f := *h.cfg.Topology
	d := topologyData{SVG: template.HTML(topology.SVG(f.Config, f.Topology)), Verify: v.Get("verify") != ""} //nolint:gosec // escaped by SVG
	p.Data = &d
	if d.Verify {
		ctx, cancel := h.callCtx(r)
		defer cancel()
		rep, err := h.cfg.Ops.Verify(ctx, f)
		if err != nil {
			p.Error = "cannot verify: " + err.Error()
			return "topology", http.StatusBadGateway
		}
		d.Report = rep
	}
	return "topology", http.StatusOK
}

// scheduledData is the scheduled page.
type scheduledData struct {
	Topic, Before string // the filter, as the request gave it
	ReadAt        time.Time
	Entries       []ledger.Entry
	Shown         []ledger.Entry // the first PageSize
}

func (h *Handler) scheduled(r *http.Request, v url.Values, p *page) (string, int) {
	p.Title = "Scheduled"
	d := scheduledData{Topic: strings.TrimSpace(v.Get("topic")), Before: strings.TrimSpace(v.Get("before")), ReadAt: time.Now()}
	p.Data = &d
	f := ledger.Filter{Destination: d.Topic}
	if d.Before != "" {
		var err error
		if f.Before, err = when.Parse(d.Before, d.ReadAt); err != nil {
			p.Error = "due before: " + err.Error()
			return "scheduled", http.StatusBadRequest
		}
	}
	ctx, cancel := h.callCtx(r)
	defer cancel()
	entries, err := h.cfg.Ops.Scheduled(ctx, f)
	if err != nil {
		p.Error = "cannot read the ledger: " + err.Error()
		return "scheduled", http.StatusBadGateway
	}
	d.Entries, d.Shown = entries, entries[:min(len(entries), h.cfg.PageSize)]
	return "scheduled", http.StatusOK
}

// heldData is the held page: the held keys of a queue ordered by key.
type heldData struct {
	Queue  string
	Keys   []ops.HeldKey
	ReadAt time.Time
}

// held lists the held keys of the queue of the form.
func (h *Handler) held(r *http.Request, v url.Values, p *page) (string, int) {
	d := heldData{Queue: v.Get("queue"), ReadAt: time.Now()}
	p.Title, p.Data = "Held keys of "+d.Queue, &d
	if d.Queue == "" {
		p.Error = "name the queue ordered by key: ?queue="
		return "held", http.StatusBadRequest
	}
	ctx, cancel := h.callCtx(r)
	defer cancel()
	keys, err := h.cfg.Ops.Held(ctx, d.Queue)
	if err != nil {
		p.Error = "cannot read the held keys: " + err.Error()
		return "held", http.StatusBadGateway
	}
	d.Keys = keys
	return "held", http.StatusOK
}
