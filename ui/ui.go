package ui

import (
	"bytes"
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/ops"
	"github.com/warrenmq/warren/outbox"
	"github.com/warrenmq/warren/topology"
)

// Action is what a request asks for, as Config.Authorize is told.
type Action string

// The actions. ActionView is every page; the others change the broker and are refused
// unless Config.AllowActions.
const (
	ActionView   Action = "view"
	ActionReplay Action = "replay" // replay poison or parked messages, or outbox rows set aside
	ActionDelete Action = "delete" // delete poison messages
	ActionKill   Action = "kill"   // stop every consumer of a queue
	ActionResume Action = "resume" // let them consume again
	ActionCancel Action = "cancel" // cancel a scheduled message (see package ledger)
	// ActionRelease and ActionSkip act on a held key of a queue ordered by key (see
	// ops.Ops.ReleaseKey and SkipKey).
	ActionRelease Action = "release"
	ActionSkip    Action = "skip"
)

// Config configures a Handler.
type Config struct {
	// Ops reads and operates the broker. Required; the Handler does not close it.
	Ops *ops.Ops
	// Killer sends kill and resume commands; nil hides them. Its Config.Wait is how long a
	// page waits for the consumers' confirmations. The Handler does not close it.
	Killer *kill.Killer
	// Queues are the work queues shown. Empty: the ones the management API lists
	// (ops.Config.Management), read on every overview.
	Queues []string
	// Outbox, if set, is an outbox on PostgreSQL (package outbox) that the overview shows (rows
	// waiting, the oldest one's age, relays, rows set aside, inbox keys) and whose rows set
	// aside the outbox page lists, with their reason, and replays (ActionReplay).
	Outbox *Outbox
	// Topology, if set, is drawn on the topology page, which also verifies the broker
	// against it (ops.Ops.Verify) when asked.
	Topology *topology.File
	// Prefix is the path the Handler is mounted under, e.g. "/warren" (no trailing slash);
	// every link and form starts with it. The Handler is given the whole path: mount it
	// with http.StripPrefix(Prefix, h) only if you set no Prefix.
	Prefix string
	// AllowActions lets the pages replay, delete, kill, resume, cancel, and release and skip
	// held keys. False, the default, is
	// read-only: every action is refused on the server, whatever the request.
	AllowActions bool
	// Authorize, if set, is called first with ActionView for every request the Handler is
	// given, before anything else answers it (pages, assets, redirects, not found, method not
	// allowed), and then, for an action, with the action once the read-only, origin and CSRF
	// checks pass; an error refuses the request (403, with the error's text).
	Authorize func(r *http.Request, a Action) error
	// User names who made a request, for the audit log line of each action. Default: the
	// basic-auth user if any, else the remote address.
	User func(r *http.Request) string
	// Redact, if set, is called on a copy of every message read (its Headers and Body are
	// copies too), before anything is made of it: it may blank headers, the error or the body.
	// The pages, failure groups, filters and message details see the redacted copies alone,
	// and the count, replay and delete of what a filter selects select by them
	// (ops.Filter.Redact; there the copy has no body): a value Redact blanks cannot be found
	// by filtering on it. A poison message's group is computed from what Redact leaves (see
	// ops.Redacted). It is called from concurrent requests.
	Redact func(m *ops.Message)
	// PageSize is the number of messages a list shows per page. Default 50.
	PageSize int
	// ScanLimit is the most messages a poison or parked page reads, from the head of the
	// queue; the page says how many it read of how many. Default DefaultScanLimit;
	// negative: all. On RabbitMQ 3.x a quorum queue puts the messages read back at its tail
	// (see ops.Browse.Scan). Replays, deletes and their counts read every message.
	ScanLimit int
	// SnapshotAge is how long the messages a page read are reused, by its other pages,
	// filters and message details, before the queue is read again. Default 15s.
	SnapshotAge time.Duration
	// SampleInterval is how often the Handler samples the queues for the overview's charts
	// (the last hour is kept). Default 10s; negative: no sampling, no charts.
	SampleInterval time.Duration
	// Timeout bounds what one page asks of the broker. Default 10s.
	Timeout time.Duration
	// CountTimeout bounds the count that a replay or a delete shows before it is confirmed,
	// which reads the whole queue (docs/dashboard.md has how long that takes). Default 2m. The replays and deletes themselves
	// run until they end or Close.
	CountTimeout time.Duration
	// CSRFKey signs the forms' CSRF tokens: give every replica behind one address the same
	// key. Default: a random key per Handler.
	CSRFKey []byte
}

// Defaults of Config.
const (
	DefaultPageSize       = 50
	DefaultScanLimit      = 10000
	DefaultSnapshotAge    = 15 * time.Second
	DefaultSampleInterval = 10 * time.Second
	DefaultTimeout        = 10 * time.Second
	DefaultCountTimeout   = 2 * time.Minute
)

// WithDefaults returns c with every unset field set to its default.
func (c Config) WithDefaults() Config {
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	if c.ScanLimit == 0 {
		c.ScanLimit = DefaultScanLimit
	}
	if c.SnapshotAge == 0 {
		c.SnapshotAge = DefaultSnapshotAge
	}
	if c.SampleInterval == 0 {
		c.SampleInterval = DefaultSampleInterval
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.CountTimeout == 0 {
		c.CountTimeout = DefaultCountTimeout
	}
	if c.User == nil {
		c.User = remoteUser
	}
	if c.Outbox != nil && c.Outbox.Schema == "" {
		box := *c.Outbox
		box.Schema = outbox.DefaultSchema
		c.Outbox = &box
	}
	return c
}

// Validate reports the first field of c that is not usable.
func (c Config) Validate() error {
	switch {
	case c.Ops == nil:
		return errors.New("ui: Config.Ops is nil")
	case c.Prefix != "" && (!strings.HasPrefix(c.Prefix, "/") || strings.HasSuffix(c.Prefix, "/")):
		return fmt.Errorf("ui: Config.Prefix %q: want a path that starts with / and does not end with one", c.Prefix)
	case strings.ContainsFunc(c.Prefix, func(r rune) bool { return r == '{' || r == '}' || unicode.IsSpace(r) || unicode.IsControl(r) }):
		// braces are http.ServeMux's wildcards (its patterns would panic or match another
		// path), and whitespace and control characters do not belong in a link's path
		return fmt.Errorf("ui: Config.Prefix %q: braces, spaces and control characters are not allowed", c.Prefix)
	case c.Prefix != "" && path.Clean(c.Prefix) != c.Prefix:
		// http.ServeMux panics on a pattern that no cleaned request path can match
		return fmt.Errorf("ui: Config.Prefix %q: want a clean path (no //, . or .. segment)", c.Prefix)
	case c.PageSize < 0:
		return fmt.Errorf("ui: Config.PageSize %d is negative", c.PageSize)
	case c.SnapshotAge < 0:
		return fmt.Errorf("ui: Config.SnapshotAge %s is negative", c.SnapshotAge)
	case c.Timeout < 0:
		return fmt.Errorf("ui: Config.Timeout %s is negative", c.Timeout)
	case c.CountTimeout < 0:
		return fmt.Errorf("ui: Config.CountTimeout %s is negative", c.CountTimeout)
	case c.CSRFKey != nil && len(c.CSRFKey) < 16:
		return fmt.Errorf("ui: Config.CSRFKey has %d bytes: want at least 16", len(c.CSRFKey))
	case c.Outbox != nil && c.Outbox.DB == nil:
		return errors.New("ui: Config.Outbox.DB is nil")
	}
	if c.Outbox != nil && c.Outbox.Schema != "" {
		if err := (outbox.Config{Schema: c.Outbox.Schema}).Validate(); err != nil {
			return fmt.Errorf("ui: Config.Outbox: %w", err)
		}
	}
	return nil
}

func remoteUser(r *http.Request) string {
	if u, _, ok := r.BasicAuth(); ok {
		return u
	}
	return r.RemoteAddr
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// staticFiles are the files of the static directory, by their name in it.
var staticFiles, _ = fs.Sub(staticFS, "static")

// Handler serves the dashboard. Close stops its sampling and the actions under way.
type Handler struct {
	cfg     Config
	logger  watermill.LoggerAdapter
	pages   map[string]*template.Template
	mux     *http.ServeMux
	origin  *http.CrossOriginProtection
	csrfKey []byte
	samples *sampler
	jobs    *jobs
	reads   *snapshots

	ctx    context.Context // cancelled by Close: the sampler's and the jobs'
	cancel context.CancelFunc
	wg     sync.WaitGroup // the sampler and the jobs
	mu     sync.Mutex     // orders Close and the start of a job (see track)
	closed bool           // Close was called: no job starts
}

var _ http.Handler = (*Handler)(nil)

// New returns a Handler, or an error naming the first invalid field of config. It starts
// sampling the queues at once.
func New(config Config, logger watermill.LoggerAdapter) (*Handler, error) {
	if err := config.Validate(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	h := &Handler{cfg: config.WithDefaults(), logger: logger, origin: http.NewCrossOriginProtection(), jobs: newJobs()}
	h.reads = newSnapshots(h.cfg.SnapshotAge)
	h.csrfKey = h.cfg.CSRFKey
	if h.csrfKey == nil {
		h.csrfKey = make([]byte, 32)
		_, _ = rand.Read(h.csrfKey)
	}
	pages, err := parsePages(h.funcs())
	if err != nil {
		return nil, err
	}
	h.pages = pages
	h.ctx, h.cancel = context.WithCancel(context.Background())
	h.samples = newSampler(h.cfg.SampleInterval)
	if h.cfg.SampleInterval > 0 {
		h.wg.Add(1)
		go h.sample()
	}
	h.routes()
	return h, nil
}

// Close stops the sampling and cancels the actions under way, and waits for them. No action
// starts after it.
func (h *Handler) Close() error {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.cancel()
	h.wg.Wait()
	return nil
}

// track counts one more goroutine that Close waits for, and reports true; once Close is
// called it reports false and counts nothing. It and Close hold h.mu, so that no goroutine is
// counted once Close has begun to wait.
func (h *Handler) track() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.wg.Add(1)
	return true
}

func (h *Handler) routes() {
	p := h.cfg.Prefix
	m := http.NewServeMux()
	m.HandleFunc("GET "+p+"/static/{file...}", h.static)
	m.HandleFunc("GET "+p+"/{$}", h.view(h.overview))
	m.HandleFunc("GET "+p+"/poison", h.view(h.poison))
	m.HandleFunc("GET "+p+"/message", h.view(h.message))
	m.HandleFunc("GET "+p+"/parked", h.view(h.parked))
	m.HandleFunc("GET "+p+"/jobs/{id}", h.view(h.job))
	m.HandleFunc("GET "+p+"/topology", h.view(h.topology))
	m.HandleFunc("GET "+p+"/scheduled", h.view(h.scheduled))
	m.HandleFunc("GET "+p+"/outbox", h.view(h.outboxPage))
	m.HandleFunc("POST "+p+"/outbox/replay", h.act(ActionReplay, h.replayOutbox))
	m.HandleFunc("POST "+p+"/cancel", h.act(ActionCancel, h.cancelScheduled))
	m.HandleFunc("GET "+p+"/held", h.view(h.held))
	m.HandleFunc("POST "+p+"/held/release", h.act(ActionRelease, h.actOnHeld))
	m.HandleFunc("POST "+p+"/held/skip", h.act(ActionSkip, h.actOnHeld))
	m.HandleFunc("POST "+p+"/replay", h.act(ActionReplay, h.replay))
	m.HandleFunc("POST "+p+"/delete", h.act(ActionDelete, h.delete))
	m.HandleFunc("POST "+p+"/kill", h.act(ActionKill, h.kill))
	m.HandleFunc("POST "+p+"/resume", h.act(ActionResume, h.kill))
	if p != "" {
		m.Handle("GET "+p, http.RedirectHandler(p+"/", http.StatusMovedPermanently))
	}
	h.mux = m
}

// static serves the file of the embedded static directory that the path names; a directory
// is not listed (404).
func (h *Handler) static(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	if fi, err := fs.Stat(staticFiles, name); err != nil || fi.IsDir() {
		http.NotFound(w, r)
		return
	}
	http.ServeFileFS(w, r, staticFiles, name)
}

// ServeHTTP implements http.Handler. Authorize is asked with ActionView before anything
// else, the ServeMux's redirects to a clean path and its not-found answers included.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Referrer-Policy", "same-origin")
	if !h.authorized(w, r, ActionView) {
		return
	}
	h.mux.ServeHTTP(w, r)
}

// page is what every template is given.
type page struct {
	Title   string
	Prefix  string
	Actions bool   // Config.AllowActions
	Kill    bool   // a Killer is set
	Drawn   bool   // a Topology is set
	Outbox  bool   // an Outbox is set
	CSRF    string // the token of the forms
	Error   string // what went wrong, shown above the content
	Data    any
}

// view serves a page (ServeHTTP has asked Authorize): fn is given the request's form (see
// form), and its error is shown in the page.
func (h *Handler) view(fn func(r *http.Request, v url.Values, p *page) (string, int)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v, err := form(r)
		if err != nil {
			h.refuse(w, r, http.StatusBadRequest, err.Error())
			return
		}
		p := h.newPage(w, r)
		name, status := fn(r, v, p)
		h.render(w, status, name, p)
	}
}

// act serves an action: refused when read-only, without a valid CSRF token, from another
// origin or by Authorize (asked with a, after ServeHTTP asked with ActionView); fn then runs
// it with the request's form (see form).
func (h *Handler) act(a Action, fn func(w http.ResponseWriter, r *http.Request, v url.Values, a Action)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.cfg.AllowActions {
			h.refuse(w, r, http.StatusForbidden, "read-only: actions are not enabled (ui.Config.AllowActions)")
			return
		}
		if err := h.origin.Check(r); err != nil {
			h.refuse(w, r, http.StatusForbidden, "refused: "+err.Error())
			return
		}
		if !h.validToken(r) {
			h.refuse(w, r, http.StatusForbidden, "refused: the form's CSRF token is missing or wrong; load the page again")
			return
		}
		if !h.authorized(w, r, a) {
			return
		}
		v, err := form(r)
		if err != nil {
			h.refuse(w, r, http.StatusBadRequest, err.Error())
			return
		}
		fn(w, r, v, a)
	}
}

func (h *Handler) authorized(w http.ResponseWriter, r *http.Request, a Action) bool {
	if h.cfg.Authorize == nil {
		return true
	}
	if err := h.cfg.Authorize(r, a); err != nil {
		h.refuse(w, r, http.StatusForbidden, "not authorised: "+err.Error())
		return false
	}
	return true
}

// refuse renders the error page with status.
func (h *Handler) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	p := h.newPage(w, r)
	p.Title, p.Error = http.StatusText(status), msg
	h.render(w, status, "error", p)
}

func (h *Handler) newPage(w http.ResponseWriter, r *http.Request) *page {
	return &page{Prefix: h.cfg.Prefix, Actions: h.cfg.AllowActions, Kill: h.cfg.Killer != nil, Drawn: h.cfg.Topology != nil,
		Outbox: h.cfg.Outbox != nil, CSRF: h.token(w, r)}
}

// render writes page name with its layout, or, for "PAGE:TEMPLATE", that template of the page
// alone (a part that htmx swaps in).
func (h *Handler) render(w http.ResponseWriter, status int, name string, p *page) {
	name, part, ok := strings.Cut(name, ":")
	if !ok {
		part = "layout"
	}
	var b bytes.Buffer // the whole page first: an error still gets its status
	if err := h.pages[name].ExecuteTemplate(&b, part, p); err != nil {
		h.logger.Error("ui: cannot render a page", err, watermill.LogFields{"page": name})
		http.Error(w, "cannot render the page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = b.WriteTo(w)
}

// callCtx is a request's context bounded by Config.Timeout.
func (h *Handler) callCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), h.cfg.Timeout)
}

// audit writes the log line of an action: who, what, on which queue, how many.
func (h *Handler) audit(r *http.Request, a Action, queue string, fields watermill.LogFields) {
	f := watermill.LogFields{"user": h.cfg.User(r), "action": string(a), "queue": queue}
	h.logger.Info("ui: action", f.Add(fields))
}
