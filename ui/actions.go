package ui

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/warrenmq/warren/kill"
	"github.com/warrenmq/warren/ledger"
	"github.com/warrenmq/warren/ops"
)

// confirmData is the page that asks to confirm a replay or a delete: how many messages the
// filter selects now (the dry run), and the same form with confirm set.
type confirmData struct {
	Action  Action
	Queue   string // "" for the parked messages
	Form    url.Values
	Matches int
	Scanned int
	To      string
	Rate    string
}

// replay and delete: without the field confirm, count what the filter selects and ask to
// confirm; with it, start a job and send the browser to its page.
func (h *Handler) replay(w http.ResponseWriter, r *http.Request, v url.Values, a Action) {
	h.bulk(w, r, v, a)
}

func (h *Handler) delete(w http.ResponseWriter, r *http.Request, v url.Values, a Action) {
	h.bulk(w, r, v, a)
}

func (h *Handler) bulk(w http.ResponseWriter, r *http.Request, v url.Values, a Action) {
	queue, to := v.Get("queue"), strings.TrimSpace(v.Get("to"))
	p := h.newPage(w, r)
	fail := func(status int, msg string) {
		p.Title, p.Error = http.StatusText(status), msg
		h.render(w, status, "error", p)
	}
	if a == ActionDelete && queue == "" {
		fail(http.StatusBadRequest, "delete: name the work queue of the poison queue (parked messages are replayed, not deleted)")
		return
	}
	f, err := filterOf(v, time.Now())
	if err != nil {
		fail(http.StatusBadRequest, err.Error())
		return
	}
	f.Redact = h.cfg.Redact // select what the pages show, and nothing by what Redact hides
	rate := 0.0
	if s := strings.TrimSpace(v.Get("rate")); s != "" {
		if rate, err = strconv.ParseFloat(s, 64); err != nil || rate < 0 {
			fail(http.StatusBadRequest, fmt.Sprintf("rate %q: want a number of messages per second, 0 for no limit", s))
			return
		}
	}
	if v.Get("confirm") == "" {
		d, err := h.count(r, v, queue, f)
		if err != nil {
			fail(readStatus(err), "cannot count the messages the filter selects: "+err.Error())
			return
		}
		d.Action, d.To, d.Rate = a, to, strings.TrimSpace(v.Get("rate"))
		p.Title, p.Data = "Confirm "+string(a), d
		h.render(w, http.StatusOK, "confirm", p)
		return
	}
	if !h.track() {
		fail(http.StatusServiceUnavailable, "the dashboard is closing")
		return
	}
	j := h.jobs.add(a, queue)
	h.audit(r, a, queue, watermill.LogFields{"job": j.ID, "filter": filterForm(v).Encode(), "to": to, "state": "started"})
	user := h.cfg.User(r)
	go func() {
		defer h.wg.Done()
		res, err := h.run(j, f, to, rate)
		j.finish(res, err)
		fields := watermill.LogFields{"user": user, "action": string(a), "queue": queue, "job": j.ID, "done": res.Replayed, "state": "finished"}
		if err != nil {
			fields["err"] = err.Error()
		}
		h.logger.Info("ui: action", fields)
	}()
	http.Redirect(w, r, h.cfg.Prefix+"/jobs/"+j.ID, http.StatusSeeOther)
}

// count reads the whole poison queue of queue (the parking queue for ""), within
// Config.CountTimeout, and counts what f selects.
func (h *Handler) count(r *http.Request, v url.Values, queue string, f ops.Filter) (confirmData, error) {
	d := confirmData{Queue: queue, Form: filterForm(v)}
	ctx, cancel := context.WithTimeout(r.Context(), h.cfg.CountTimeout)
	defer cancel()
	all, err := h.browseAlone(ctx, queue, ops.Browse{})
	if err != nil {
		return d, err
	}
	d.Scanned = len(all)
	for _, m := range all {
		if f.Match(m) {
			d.Matches++
		}
	}
	return d, nil
}

// run runs job j, a replay or a delete of what f selects, until it ends or Close. It holds
// the queue meanwhile (see snapshots): it waits for the read under way, and the pages of
// the queue are refused until it ends.
func (h *Handler) run(j *job, f ops.Filter, to string, rate float64) (ops.ReplayResult, error) {
	var res ops.ReplayResult
	unlock, err := h.reads.lock(h.ctx, j.Queue, j)
	if err != nil {
		return res, err
	}
	defer unlock()
	h.reads.forget(j.Queue)
	defer h.reads.forget(j.Queue)
	if j.Action == ActionDelete {
		res.Replayed, err = h.cfg.Ops.DeletePoisoned(h.ctx, j.Queue, ops.Browse{Filter: f})
		return res, err
	}
	opt := ops.ReplayOptions{Filter: f, To: to, Rate: rate, Progress: j.progress}
	if j.Queue == "" {
		return h.cfg.Ops.ReplayParked(h.ctx, opt)
	}
	return h.cfg.Ops.ReplayPoisoned(h.ctx, j.Queue, opt)
}

func (h *Handler) job(r *http.Request, _ url.Values, p *page) (string, int) {
	j := h.jobs.get(r.PathValue("id"))
	if j == nil {
		p.Title, p.Error = "Not found", "no such job (jobs are kept in the process that ran them, the last 100)"
		return "error", http.StatusNotFound
	}
	v := j.view()
	p.Title, p.Data = "Job "+v.ID, v
	if r.Header.Get("HX-Request") != "" {
		return "job:progress", http.StatusOK
	}
	return "job", http.StatusOK
}

// kill serves kill and resume: the command is sent, the consumers' confirmations waited for
// (the Killer's Config.Wait), and the result shown.
func (h *Handler) kill(w http.ResponseWriter, r *http.Request, v url.Values, a Action) {
	queue := v.Get("queue")
	p := h.newPage(w, r)
	if h.cfg.Killer == nil {
		p.Title, p.Error = "Not enabled", "kill and resume are not enabled (ui.Config.Killer)"
		h.render(w, http.StatusForbidden, "error", p)
		return
	}
	action := kill.Resume
	if a == ActionKill {
		action = kill.Stop
	}
	res, err := h.cfg.Killer.Send(r.Context(), queue, action)
	fields := watermill.LogFields{"consumers": res.Consumers, "processes": res.Processes, "confirmed": res.Confirmed()}
	status := http.StatusOK
	switch {
	case errors.Is(err, kill.ErrNoListener):
		p.Error = err.Error() // a warning: remembered
	case err != nil:
		p.Error, status = err.Error(), http.StatusBadGateway
		fields["err"] = err.Error()
	}
	h.audit(r, a, queue, fields)
	p.Title, p.Data = string(action)+" "+queue, res
	h.render(w, status, "kill", p)
}

// cancelScheduled cancels the scheduled message of the form's id, and shows the scheduled page.
func (h *Handler) cancelScheduled(w http.ResponseWriter, r *http.Request, v url.Values, a Action) {
	id := v.Get("id")
	ctx, cancel := h.callCtx(r)
	defer cancel()
	err := h.cfg.Ops.Cancel(ctx, id)
	fields := watermill.LogFields{}
	if err != nil {
		fields["err"] = err.Error()
	}
	h.audit(r, a, id, fields)
	p := h.newPage(w, r)
	status := http.StatusOK
	if err != nil {
		p.Error, status = err.Error(), http.StatusBadGateway
		if errors.Is(err, ledger.ErrDelivered) || errors.Is(err, ledger.ErrUnknown) {
			status = http.StatusConflict
		}
	}
	name, _ := h.scheduled(r, url.Values{}, p)
	if err == nil {
		p.Title = "Cancelled " + id
	}
	h.render(w, status, name, p)
}

// actOnHeld releases or skips the held key of the form's queue, and shows the held page.
func (h *Handler) actOnHeld(w http.ResponseWriter, r *http.Request, v url.Values, a Action) {
	queue, key := v.Get("queue"), v.Get("key")
	ctx, cancel := h.callCtx(r)
	defer cancel()
	act := h.cfg.Ops.ReleaseKey
	if a == ActionSkip {
		act = h.cfg.Ops.SkipKey
	}
	err := act(ctx, queue, key)
	fields := watermill.LogFields{"key": key}
	if err != nil {
		fields["err"] = err.Error()
	}
	h.audit(r, a, queue, fields)
	p := h.newPage(w, r)
	status := http.StatusOK
	name, _ := h.held(r, url.Values{"queue": {queue}}, p)
	if err != nil {
		p.Error, status = err.Error(), http.StatusBadGateway
		if errors.Is(err, ops.ErrNotHeld) {
			status = http.StatusConflict
		}
	} else {
		p.Title = fmt.Sprintf("%s %q of %s: asked", a, key, queue)
	}
	h.render(w, status, name, p)
}

// jobs are the replays and deletes started, the last maxJobs kept.
type jobs struct {
	mu    sync.Mutex
	next  int
	byID  map[string]*job
	order []string
}

const maxJobs = 100

func newJobs() *jobs { return &jobs{byID: map[string]*job{}} }

func (js *jobs) add(a Action, queue string) *job {
	js.mu.Lock()
	defer js.mu.Unlock()
	js.next++
	j := &job{jobView: jobView{ID: strconv.Itoa(js.next), Action: a, Queue: queue, Started: time.Now()}}
	js.byID[j.ID] = j
	js.order = append(js.order, j.ID)
	if len(js.order) > maxJobs {
		delete(js.byID, js.order[0])
		js.order = js.order[1:]
	}
	return j
}

func (js *jobs) get(id string) *job {
	js.mu.Lock()
	defer js.mu.Unlock()
	return js.byID[id]
}

// job is one replay or delete, under way or finished.
type job struct {
	mu sync.Mutex
	jobView
}

// jobView is what a job's page shows.
type jobView struct {
	ID       string
	Action   Action
	Queue    string
	Started  time.Time
	Finished time.Time // zero while under way
	Result   ops.ReplayResult
	Err      string
}

// progress keeps r, with a copy of its Failed map, which the replay goes on writing.
func (j *job) progress(r ops.ReplayResult) {
	r.Failed = maps.Clone(r.Failed)
	j.mu.Lock()
	j.Result = r
	j.mu.Unlock()
}

func (j *job) finish(r ops.ReplayResult, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.Result, j.Finished = r, time.Now()
	if err != nil {
		j.Err = err.Error()
		if errors.Is(err, context.Canceled) {
			j.Err = "stopped: the dashboard was closed; " + j.Err
		}
	}
}

func (j *job) view() jobView {
	j.mu.Lock()
	defer j.mu.Unlock()
	v := j.jobView
	return v
}
