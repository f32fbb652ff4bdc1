package ui

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/jackc/pgx/v5"

	"github.com/warrenmq/warren/outbox"
)

// Outbox is an outbox on PostgreSQL (package outbox) that a Handler shows (Config.Outbox).
type Outbox struct {
	// DB reaches the outbox's database; the Handler does not close it. The pages ask it from
	// concurrent requests: give a *pgxpool.Pool (a *pgx.Conn answers one at a time).
	// Required.
	DB OutboxDB
	// Schema is the outbox's schema (outbox.Config.Schema). Default outbox.DefaultSchema.
	Schema string
}

// OutboxDB is what a Handler asks of the outbox's database: a *pgxpool.Pool has it all.
type OutboxDB interface {
	outbox.Querier
	outbox.Execer
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// outboxData is the outbox's part of the overview, and the outbox page.
type outboxData struct {
	Prefix string
	Schema string
	Stats  outbox.Stats
	Err    string // why the outbox could not be read
	ReadAt time.Time
	// Rows are the first Config.PageSize rows set aside, oldest first (the outbox page).
	Rows []outbox.SetAsideRow
	// Confirm asks to confirm the replay of every row set aside.
	Confirm bool
}

// problems are what is wrong with the outbox, a line each: it cannot be read, rows are set
// aside, rows wait and no relay is connected.
func (d *outboxData) problems() []string {
	what := "outbox " + d.Schema + ": "
	if d.Err != "" {
		return []string{what + "cannot read PostgreSQL"}
	}
	ps := d.Stats.Problems()
	for i := range ps {
		ps[i] = what + ps[i]
	}
	return ps
}

func rows(n int64) string {
	if n == 1 {
		return "row"
	}
	return "rows"
}

// readOutbox reads the outbox's figures, and its first rows set aside when list is set,
// within Config.Timeout; nil without Config.Outbox. An error is said in the data.
func (h *Handler) readOutbox(r *http.Request, list bool) *outboxData {
	box := h.cfg.Outbox
	if box == nil {
		return nil
	}
	ctx, cancel := h.callCtx(r)
	defer cancel()
	d := &outboxData{Prefix: h.cfg.Prefix, Schema: box.Schema, ReadAt: time.Now()}
	st, err := outbox.ReadStats(ctx, box.DB, box.Schema)
	if err == nil && list && st.SetAside > 0 {
		d.Rows, err = outbox.ListSetAside(ctx, box.DB, box.Schema, h.cfg.PageSize)
	}
	if err != nil {
		d.Err = "cannot read the outbox: " + err.Error()
		return d
	}
	d.Stats = st
	return d
}

// outboxPage lists the rows set aside, with their reason.
func (h *Handler) outboxPage(r *http.Request, _ url.Values, p *page) (string, int) {
	if h.cfg.Outbox == nil {
		p.Title, p.Error = "Outbox", "no outbox to show (ui.Config.Outbox; warren ui --postgres URL)"
		return "error", http.StatusNotFound
	}
	p.Title = "Outbox " + h.cfg.Outbox.Schema
	d := h.readOutbox(r, true)
	p.Data = d
	if d.Err != "" {
		return "outbox", http.StatusBadGateway
	}
	return "outbox", http.StatusOK
}

// replayOutbox gives rows set aside back to the relay: the rows of the form's ids at once;
// without an id, every row, once confirmed (without the field confirm it asks). It shows
// the outbox page.
func (h *Handler) replayOutbox(w http.ResponseWriter, r *http.Request, v url.Values, a Action) {
	if h.cfg.Outbox == nil {
		p := h.newPage(w, r)
		p.Title, p.Error = "Not found", "no outbox to replay (ui.Config.Outbox)"
		h.render(w, http.StatusNotFound, "error", p)
		return
	}
	var ids []int64
	for _, s := range v["id"] {
		id, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
		if err != nil {
			h.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("row %q: want a row number", s))
			return
		}
		ids = append(ids, id)
	}
	p := h.newPage(w, r)
	if len(ids) == 0 && v.Get("confirm") == "" {
		name, status := h.outboxPage(r, v, p)
		if d, ok := p.Data.(*outboxData); ok && d.Err == "" {
			d.Confirm, p.Title = true, "Confirm replay"
		}
		h.render(w, status, name, p)
		return
	}
	ctx, cancel := h.callCtx(r)
	defer cancel()
	n, err := outbox.Replay(ctx, h.cfg.Outbox.DB, h.cfg.Outbox.Schema, ids...)
	fields := watermill.LogFields{"outbox": h.cfg.Outbox.Schema, "rows": "all", "replayed": n}
	if len(ids) > 0 {
		fields["rows"] = fmt.Sprint(ids)
	}
	if err != nil {
		fields["err"] = err.Error()
	}
	h.audit(r, a, "", fields)
	name, status := h.outboxPage(r, url.Values{}, p)
	switch {
	case err != nil:
		p.Error, status = err.Error(), http.StatusBadGateway
	case len(ids) > 0 && n < int64(len(ids)):
		p.Error, status = fmt.Sprintf("%d of the %d rows named were not set aside (replayed since?)", int64(len(ids))-n, len(ids)), http.StatusConflict
	}
	if err == nil {
		p.Title = fmt.Sprintf("Replayed %d %s", n, rows(n))
	}
	h.render(w, status, name, p)
}
