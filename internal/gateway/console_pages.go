package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/console"
	"github.com/harvest-run/harvest/internal/directory"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/weights"
)

// The console pages beside the admission dashboard:
//
//	GET  /admin/runs                          runs, filtered (tenant, queue, status, name), paged
//	GET  /admin/runs/{tenant}/{id}            one run with its tasks
//	POST /admin/runs/{tenant}/{id}/cancel     cancel it (form: csrf)
//	POST /admin/runs/{tenant}/{id}/retry      retry it (form: csrf)
//	GET  /admin/queues                        queues of every shard
//	GET  /admin/queues/{queue}                one queue: depths, pause, keys, share chart
//	POST /admin/queues/{queue}/pause          pause it on every shard (form: csrf)
//	POST /admin/queues/{queue}/resume         resume it (form: csrf)
//
// Two kinds of session use them. An operator (config:read) sees every
// tenant; the queues pages also need weights:read, and the actions
// config:write (runs) or weights:write (queues). A tenant's token holding
// runs:read gets a tenant session: its own runs only, cancel and retry
// with runs:start, and none of the operator pages.

// role is what a session may see, worked out from the principal on every
// request so that a token's privileges apply as they are now.
type role int

const (
	roleNone role = iota
	roleTenant
	roleOperator
)

// consoleRole classifies a principal. The tokens file forbids config:* on
// a tenant-bound token; the tenant check is repeated so that a tenant can
// never reach the operator's view even if that rule changed.
func consoleRole(p auth.Principal) role {
	switch {
	case p.Tenant == "" && p.Has(auth.ConfigRead):
		return roleOperator
	case p.Tenant != "" && p.Has(auth.RunsRead):
		return roleTenant
	}
	return roleNone
}

// Bounds of the console pages.
const (
	pageRuns       = 50
	pageKeys       = 200
	maxFilterLen   = 256
	consoleTimeout = 10 * time.Second
)

// runStatuses are the statuses the runs filter offers, in their lifecycle
// order.
var runStatuses = []api.Status{api.StatusDeferred, api.StatusQueued, api.StatusRunning, api.StatusCompleted, api.StatusFailed, api.StatusCancelled}

type runsView struct {
	Tenant, Queue, Status, Name string
	Statuses                    []statusChoice
	Runs                        []runRow
	NextURL                     string
	Unavailable                 []int
}

type statusChoice struct {
	Value    string
	Selected bool
}

type runRow struct {
	ID, Tenant, Name, Queue, Status, Created, URL string
	Attempts, Shard                               int
}

type runView struct {
	Tenant, ID  string
	Found       bool
	Run         api.Run
	Created     string
	Claimed     string
	Finished    string
	MaxAttempts int
	Input       string
	Output      string
	RunError    string
	TraceID     string
	TraceLink   string
	Moving      bool
	Tasks       []taskRow
	Action      string // base path of the run's forms
	CanCancel   bool
	CanRetry    bool
}

type taskRow struct {
	ID                                 int64
	Step, Attempt                      int
	State, ClaimedBy, ClaimedAt, DueAt string
	CreatedAt                          string
}

type queuesView struct {
	Rows        []queueListRow
	Truncated   bool
	Unavailable []int
}

type queueListRow struct {
	console.QueueDepth
	URL    string
	Paused string
}

type queueView struct {
	Queue       string
	Action      string
	Depths      []queueListRow
	Unavailable []int
	Paused      string // who and since when, and where; empty when running everywhere
	CanPause    bool
	CanResume   bool
	Keys        []keyRow
	KeysNote    string
	Chart       template.HTML
	ChartNote   string
	Fairness    *fairnessView
}

type keyRow struct {
	Key, Label      string
	Shard           int
	Weight          string
	Overridden      bool
	Pass, Lag       string
	Pending, Claims int
}

// utc formats a database time for the pages.
func utc(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05")
}

func utcPtr(t *api.Time) string {
	if t == nil {
		return ""
	}
	return utc(t.Time)
}

// runPath is the page of one run, its parts escaped for a path.
func runPath(tenant, id string) string {
	return "/admin/runs/" + url.PathEscape(tenant) + "/" + url.PathEscape(id)
}

// queuePath is the page of one queue: queue names may hold slashes,
// spaces and any other character.
func queuePath(queue string) string {
	return "/admin/queues/" + url.PathEscape(queue)
}

// consoleGET returns the session of a GET of the console and its role. A
// browser without a session goes to the sign-in page; a session whose
// token may no longer use the console is ended with the 403 page.
func (g *Gateway) consoleGET(w http.ResponseWriter, r *http.Request) (*session, auth.Principal, role, bool) {
	sess, p, ok := g.current(r)
	if !ok {
		if _, err := r.Cookie(sessionCookie); err == nil {
			g.setCookie(w, r, sessionCookie, "", -1)
		}
		http.Redirect(w, r, "/admin", http.StatusSeeOther)
		return nil, auth.Principal{}, roleNone, false
	}
	rl, ok := g.sessionRole(w, r, sess, p)
	return sess, p, rl, ok
}

// consolePOST is consoleGET for a form: session and CSRF checked first.
func (g *Gateway) consolePOST(w http.ResponseWriter, r *http.Request) (*session, auth.Principal, role, bool) {
	sess, p, ok := g.postSession(w, r)
	if !ok {
		return nil, auth.Principal{}, roleNone, false
	}
	rl, ok := g.sessionRole(w, r, sess, p)
	return sess, p, rl, ok
}

// sessionRole is the console role of a session's token; a token that may
// no longer use the console ends the session with the 403 page.
func (g *Gateway) sessionRole(w http.ResponseWriter, r *http.Request, sess *session, p auth.Principal) (role, bool) {
	rl := consoleRole(p)
	if rl == roleNone {
		g.sessions.remove(sess.id)
		g.setCookie(w, r, sessionCookie, "", -1)
		g.refused(w, fmt.Sprintf("Token %q may not use the console: it needs config:read, or a tenant and runs:read.", p.Name))
		return roleNone, false
	}
	return rl, true
}

// base is the page data every signed-in console page starts from.
func base(title string, sess *session, p auth.Principal, rl role) pageData {
	return pageData{Title: title, SignedIn: true, Actor: p.Name, Tenant: p.Tenant, Operator: rl == roleOperator, CSRF: sess.csrf}
}

// forbidden is the 403 page inside a session: the navigation stays, so the
// user can go back to what it may see, and nothing else is shown.
func (g *Gateway) forbidden(w http.ResponseWriter, sess *session, p auth.Principal, rl role, msg string) {
	d := base("Access refused", sess, p, rl)
	d.Error = msg
	g.render(w, http.StatusForbidden, "refused", d)
}

// refuseAction records a refused console action in the audit log and
// answers with the 403 page.
func (g *Gateway) refuseAction(w http.ResponseWriter, r *http.Request, sess *session, p auth.Principal, rl role, action, queue string, attempted any, msg string) {
	body, _ := json.Marshal(attempted)
	g.auditRefused(r, weights.RefusedChange{Actor: p.Name, Action: action, Queue: queue, Attempted: body, Message: msg,
		Status: http.StatusForbidden})
	g.forbidden(w, sess, p, rl, msg+".")
}

// --- runs ---

func (g *Gateway) pageRuns(w http.ResponseWriter, r *http.Request) {
	sess, p, rl, ok := g.consoleGET(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	v := &runsView{Tenant: strings.TrimSpace(q.Get("tenant")), Queue: strings.TrimSpace(q.Get("queue")),
		Status: strings.TrimSpace(q.Get("status")), Name: strings.TrimSpace(q.Get("name"))}
	if rl == roleTenant {
		if v.Tenant != "" && v.Tenant != p.Tenant {
			g.forbidden(w, sess, p, rl, fmt.Sprintf("Token %q may list the runs of its own tenant only.", p.Name))
			return
		}
		v.Tenant = p.Tenant
	}
	for _, s := range runStatuses {
		v.Statuses = append(v.Statuses, statusChoice{Value: string(s), Selected: string(s) == v.Status})
	}
	d := base("Runs", sess, p, rl)
	d.Live, d.Runs = true, v
	status := http.StatusOK
	f := console.RunFilter{Tenant: v.Tenant, Queue: v.Queue, Name: v.Name, Cursor: q.Get("cursor"), Limit: pageRuns}
	switch {
	case len(v.Tenant) > maxFilterLen || len(v.Queue) > maxFilterLen || len(v.Name) > maxFilterLen || len(f.Cursor) > 4*maxFilterLen:
		d.Error, status = "A filter is too long.", http.StatusBadRequest
	case v.Status != "" && !validStatus(v.Status):
		d.Error, status = fmt.Sprintf("Unknown status %q.", v.Status), http.StatusBadRequest
	}
	if v.Status != "" {
		f.Statuses = []api.Status{api.Status(v.Status)}
	}
	if status == http.StatusOK {
		ctx, cancel := context.WithTimeout(r.Context(), consoleTimeout)
		defer cancel()
		page, err := console.ListRuns(ctx, g.shards, f)
		if err != nil {
			d.Error, status = g.consoleError(err, "list runs")
		}
		v.Unavailable = page.UnavailableShards
		for _, run := range page.Runs {
			if rl == roleTenant && run.Tenant != p.Tenant {
				// The filter already keeps to the tenant; this guards the
				// page against a listing that did not.
				continue
			}
			v.Runs = append(v.Runs, runRow{ID: run.ID, Tenant: run.Tenant, Name: run.Name, Queue: run.Queue,
				Status: string(run.Status), Created: utc(run.CreatedAt.Time), URL: runPath(run.Tenant, run.ID),
				Attempts: run.Attempts, Shard: run.Shard})
		}
		if page.NextCursor != "" {
			next := url.Values{"cursor": {page.NextCursor}}
			for k, val := range map[string]string{"queue": v.Queue, "status": v.Status, "name": v.Name} {
				if val != "" {
					next.Set(k, val)
				}
			}
			if rl == roleOperator && v.Tenant != "" {
				next.Set("tenant", v.Tenant)
			}
			v.NextURL = "/admin/runs?" + next.Encode()
		}
	}
	g.render(w, status, "runs", d)
}

func validStatus(s string) bool {
	for _, st := range runStatuses {
		if string(st) == s {
			return true
		}
	}
	return false
}

// consoleError is the message and status of an error of the console
// package: a bad filter or cursor is the caller's (400); anything else is
// told as unavailable, with the detail in the log only.
func (g *Gateway) consoleError(err error, what string) (string, int) {
	var ae *api.Error
	switch {
	case errors.Is(err, console.ErrBadCursor):
		return "The page cursor is not one this console made; start from the first page.", http.StatusBadRequest
	case errors.As(err, &ae):
		return ae.Message, ae.Status
	}
	g.log.Warn("console page: "+what, "err", err)
	return "Cannot " + what + " now: " + err.Error(), http.StatusServiceUnavailable
}

// runAccess checks that the session may look at the runs of tenant: a
// tenant session only at its own.
func (g *Gateway) runAccess(w http.ResponseWriter, sess *session, p auth.Principal, rl role, tenant string) bool {
	if rl == roleTenant && tenant != p.Tenant {
		g.forbidden(w, sess, p, rl, fmt.Sprintf("Token %q may see the runs of its own tenant only.", p.Name))
		return false
	}
	return true
}

func (g *Gateway) pageRun(w http.ResponseWriter, r *http.Request) {
	sess, p, rl, ok := g.consoleGET(w, r)
	if !ok {
		return
	}
	tenant, id := r.PathValue("tenant"), r.PathValue("id")
	if !g.runAccess(w, sess, p, rl, tenant) {
		return
	}
	d := base("Run "+id, sess, p, rl)
	switch r.URL.Query().Get("done") {
	case "cancelled":
		d.Done = "Cancelled."
	case "retried":
		d.Done = "Put back in its queue for another attempt."
	}
	g.runPage(w, r, http.StatusOK, d, p, rl, tenant, id)
}

// runPage reads the run and renders its page with status (or the status
// the read answers: 404, 503...). d carries any message of an action.
func (g *Gateway) runPage(w http.ResponseWriter, r *http.Request, status int, d pageData, p auth.Principal, rl role, tenant, id string) {
	v := &runView{Tenant: tenant, ID: id, Action: runPath(tenant, id)}
	d.Live, d.Run = true, v
	if auth.ValidateTenant(tenant) != nil || id == "" || len(id) > maxFilterLen {
		d.Error = "No such run."
		g.render(w, http.StatusNotFound, "run", d)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), consoleTimeout)
	defer cancel()
	if !g.knownTenant(ctx, tenant) {
		d.Error = "No such run."
		g.render(w, http.StatusNotFound, "run", d)
		return
	}
	var detail console.RunDetail
	_, shard, err := g.readMoving(ctx, tenant, func(ctx context.Context, shard int) (api.Run, error) {
		var err error
		detail, err = console.Inspect(ctx, g.shards[shard], shard, tenant, id)
		return detail.Run, err
	})
	switch {
	case errors.Is(err, runstore.ErrNotFound):
		d.Error = "No such run."
		g.render(w, http.StatusNotFound, "run", d)
		return
	case err != nil:
		e := g.apiError(err, shard, "inspect run")
		msg := e.Message
		if e.Code == api.CodeInternal {
			msg = "Cannot read the run now: " + err.Error()
			e.Status = http.StatusServiceUnavailable
		}
		d.Error = strings.TrimSpace(d.Error + " " + msg)
		g.render(w, e.Status, "run", d)
		return
	}
	run := detail.Run
	if rl == roleOperator && run.Waiting != nil && run.Waiting.Reason == api.WaitQueuePaused {
		// The waiting object names no operator (a tenant reads it too);
		// an operator sees whose pause holds the run.
		if ps, err := weights.PausedOne(ctx, g.shards[shard], run.Queue); err == nil && ps != nil {
			run.Waiting.PausedBy = ps.By
		}
	}
	v.Found, v.Run, v.MaxAttempts, v.Moving = true, run, detail.MaxAttempts, detail.Moving
	v.Created, v.Claimed, v.Finished = utc(run.CreatedAt.Time), utcPtr(run.ClaimedAt), utcPtr(run.FinishedAt)
	v.Input = prettyJSON(detail.Input)
	v.Output = prettyJSON(run.Output)
	if run.Error != nil {
		v.RunError = *run.Error
	}
	v.TraceID, v.TraceLink = detail.TraceID, g.cfg.TraceLink(detail.TraceID)
	for i, t := range detail.Tasks {
		if i == 200 {
			break
		}
		row := taskRow{ID: t.ID, Step: t.Step, Attempt: t.Attempt, State: t.State, ClaimedBy: t.ClaimedBy,
			DueAt: utc(t.DueAt), CreatedAt: utc(t.CreatedAt)}
		if t.ClaimedAt != nil {
			row.ClaimedAt = utc(*t.ClaimedAt)
		}
		v.Tasks = append(v.Tasks, row)
	}
	v.CanCancel = !run.Status.Final()
	v.CanRetry = run.Status == api.StatusFailed || run.Status == api.StatusCancelled
	g.render(w, status, "run", d)
}

// prettyJSON indents a JSON document for a <pre>; what does not parse is
// shown as it is.
func prettyJSON(raw json.RawMessage) string {
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return string(raw)
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return string(raw)
	}
	return string(out)
}

// runActionAllowed says whether the session may cancel or retry runs of
// tenant, and why not.
func runActionAllowed(p auth.Principal, rl role, tenant string) (bool, string) {
	switch rl {
	case roleOperator:
		if !p.Has(auth.ConfigWrite) {
			return false, fmt.Sprintf("Token %q lacks the %s privilege", p.Name, auth.ConfigWrite)
		}
		return true, ""
	case roleTenant:
		if tenant != p.Tenant {
			return false, fmt.Sprintf("Token %q may act on the runs of its own tenant only", p.Name)
		}
		if !p.Has(auth.RunsStart) {
			return false, fmt.Sprintf("Token %q lacks the %s privilege", p.Name, auth.RunsStart)
		}
		return true, ""
	}
	return false, "Not allowed"
}

func (g *Gateway) pageRunCancel(w http.ResponseWriter, r *http.Request) { g.runAction(w, r, "cancel") }
func (g *Gateway) pageRunRetry(w http.ResponseWriter, r *http.Request)  { g.runAction(w, r, "retry") }

// runAction cancels or retries a run from its page, then sends the browser
// back to the page (303), or shows the page again with the refusal.
func (g *Gateway) runAction(w http.ResponseWriter, r *http.Request, what string) {
	sess, p, rl, ok := g.consolePOST(w, r)
	if !ok {
		return
	}
	tenant, id := r.PathValue("tenant"), r.PathValue("id")
	if allowed, why := runActionAllowed(p, rl, tenant); !allowed {
		// A tenant's refusal names its own tenant only: the path's
		// tenant is another's, and is not echoed back or audited.
		attempted := map[string]string{"tenant": tenant, "id": id}
		if rl == roleTenant && tenant != p.Tenant {
			attempted = map[string]string{"tenant": "(another tenant)"}
		}
		g.refuseAction(w, r, sess, p, rl, "run."+what, "", attempted, why)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), consoleTimeout)
	defer cancel()
	if !g.knownTenant(ctx, tenant) {
		// The run's page answers 404 for it, without placing it.
		g.runPage(w, r, http.StatusNotFound, base("Run "+id, sess, p, rl), p, rl, tenant, id)
		return
	}
	var e *api.Error
	done := "cancelled"
	if what == "cancel" {
		// The reason is the run's error, which its tenant reads: an
		// operator's cancel does not name the operator's token there (the
		// log does).
		by := p.Name
		if rl == roleOperator {
			by = "an operator"
			g.log.Info("console: run cancelled by an operator", "actor", p.Name, "tenant", tenant, "id", id)
		}
		_, e = g.cancelRun(ctx, tenant, id, "cancelled by "+by+" in the console")
	} else {
		done = "retried"
		_, e = g.retryRun(ctx, p.Name, tenant, id)
	}
	if e != nil {
		d := base("Run "+id, sess, p, rl)
		verb := map[string]string{"cancel": "Not cancelled", "retry": "Not retried"}[what]
		d.Error = verb + ": " + e.Message
		g.runPage(w, r, e.Status, d, p, rl, tenant, id)
		return
	}
	http.Redirect(w, r, runPath(tenant, id)+"?done="+done, http.StatusSeeOther)
}

// knownTenant reports whether the directory has an entry for tenant. A
// tenant it does not know has no runs, and asking for its home would place
// it in the directory: an operator's look at (or action on) a mistyped
// tenant must not do that.
func (g *Gateway) knownTenant(ctx context.Context, tenant string) bool {
	if _, cached := g.dir.Cached(tenant); cached {
		return true
	}
	_, err := directory.Get(ctx, g.shards[0], tenant)
	return !errors.Is(err, directory.ErrNoEntry)
}

// --- queues ---

// queueAccess lets operators holding weights:read at the queues pages.
func (g *Gateway) queueAccess(w http.ResponseWriter, sess *session, p auth.Principal, rl role) bool {
	if rl != roleOperator {
		g.forbidden(w, sess, p, rl, fmt.Sprintf("Token %q may not see the queues: they are for operators.", p.Name))
		return false
	}
	if !p.Has(auth.WeightsRead) {
		g.forbidden(w, sess, p, rl, fmt.Sprintf("Token %q lacks the %s privilege.", p.Name, auth.WeightsRead))
		return false
	}
	return true
}

func pauseText(ps *console.Pause) string {
	if ps == nil {
		return ""
	}
	return "paused by " + ps.By + " since " + utc(ps.At) + " UTC"
}

func (g *Gateway) pageQueues(w http.ResponseWriter, r *http.Request) {
	sess, p, rl, ok := g.consoleGET(w, r)
	if !ok || !g.queueAccess(w, sess, p, rl) {
		return
	}
	d := base("Queues", sess, p, rl)
	v := &queuesView{}
	d.Live, d.QueueList = true, v
	status := http.StatusOK
	ctx, cancel := context.WithTimeout(r.Context(), consoleTimeout)
	defer cancel()
	list, err := console.Queues(ctx, g.shards, 0)
	if err != nil {
		d.Error, status = g.consoleError(err, "list the queues")
	}
	v.Truncated, v.Unavailable = list.Truncated, list.UnavailableShards
	for _, q := range list.Queues {
		v.Rows = append(v.Rows, queueListRow{QueueDepth: q, URL: queuePath(q.Queue), Paused: pauseText(q.Paused)})
	}
	g.render(w, status, "queues", d)
}

func (g *Gateway) pageQueue(w http.ResponseWriter, r *http.Request) {
	sess, p, rl, ok := g.consoleGET(w, r)
	if !ok || !g.queueAccess(w, sess, p, rl) {
		return
	}
	d := base("Queue "+r.PathValue("queue"), sess, p, rl)
	switch r.URL.Query().Get("done") {
	case "paused":
		d.Done = "Paused: workers claim none of its tasks until it is resumed."
	case "resumed":
		d.Done = "Resumed."
	case "fairness":
		d.Done = "Fairness modes changed on every shard: claims follow them from the next one."
	case "group-weight":
		d.Done = "Group weight set on every shard: it applies from the group's next charge."
	case "group-weight-cleared":
		d.Done = "Group weight cleared on every shard: the group weighs 1 again."
	}
	g.queuePage(w, r, http.StatusOK, d, p, r.PathValue("queue"), nil)
}

// queuePage renders the page of queue. res, when set, is the pause or
// resume just made, whose unavailable shards the page lists.
func (g *Gateway) queuePage(w http.ResponseWriter, r *http.Request, status int, d pageData, p auth.Principal, queue string, res *api.QueuePauseResult) {
	v := &queueView{Queue: queue, Action: queuePath(queue)}
	d.Live, d.Queue = true, v
	if err := weights.ValidateQueue(queue); err != nil {
		msg := err.Error()
		var ae *api.Error
		if errors.As(err, &ae) {
			msg = ae.Message
		}
		d.Error = strings.TrimSpace(d.Error + " " + msg)
		g.render(w, http.StatusBadRequest, "queue", d)
		return
	}
	if res != nil && len(res.UnavailableShards) > 0 {
		d.Error = strings.TrimSpace(fmt.Sprintf("%s Shards %v did not take the change; send it again.", d.Error, res.UnavailableShards))
	}
	ctx, cancel := context.WithTimeout(r.Context(), consoleTimeout)
	defer cancel()

	depths, err := console.QueueDepths(ctx, g.shards, queue)
	if err != nil {
		msg, st := g.consoleError(err, "read the queue's depths")
		d.Error = strings.TrimSpace(d.Error + " " + msg)
		if status == http.StatusOK {
			status = st
		}
	}
	v.Unavailable = depths.UnavailableShards
	var pausedOn []int
	var first *console.Pause
	for _, q := range depths.Queues {
		v.Depths = append(v.Depths, queueListRow{QueueDepth: q, Paused: pauseText(q.Paused)})
		if q.Paused != nil {
			pausedOn = append(pausedOn, q.Shard)
			if first == nil || q.Paused.At.Before(first.At) {
				first = q.Paused
			}
		}
	}
	if first != nil {
		v.Paused = fmt.Sprintf("Paused by %s since %s UTC on shards %v.", first.By, utc(first.At), pausedOn)
	}
	v.CanResume = len(pausedOn) > 0
	v.CanPause = err != nil || len(pausedOn) < len(depths.Queues) || len(depths.Queues) == 0

	keys, kerr := weights.Keys(ctx, g.weightShards(), queue, pageKeys, g.readOpts(p)...)
	if kerr != nil {
		v.KeysNote = "Keys unavailable: " + kerr.Error()
	} else {
		sort.Slice(keys.Shards, func(i, j int) bool { return keys.Shards[i].Shard < keys.Shards[j].Shard })
		for _, s := range keys.Shards {
			if s.Truncated {
				v.KeysNote = strings.TrimSpace(fmt.Sprintf("%s Shard %d has more keys than the %d listed.", v.KeysNote, s.Shard, pageKeys))
			}
			for _, k := range s.Keys {
				row := keyRow{Key: k.Key, Label: k.Key, Shard: s.Shard, Weight: fmtG(k.Weight), Overridden: k.Overridden,
					Lag: fmtG(k.Lag), Pending: k.Pending, Claims: k.ClaimsLastMinute}
				if k.Key == "" {
					row.Label = "(default key)"
				}
				if k.Pass != nil {
					row.Pass = fmtG(*k.Pass)
				}
				v.Keys = append(v.Keys, row)
			}
		}
		if len(keys.UnavailableShards) > 0 {
			v.KeysNote = strings.TrimSpace(fmt.Sprintf("%s Shards %v did not answer.", v.KeysNote, keys.UnavailableShards))
		}
	}

	v.Fairness = g.fairness(ctx, p, queue)

	shares, serr := console.ClaimShares(ctx, g.shards, queue, shareBucket, shareBuckets, shareMaxKeys, "")
	if serr != nil {
		v.ChartNote = "Claim shares unavailable: " + serr.Error()
	} else {
		v.Chart = shareChart(shares)
		if len(shares.UnavailableShards) > 0 {
			v.ChartNote = fmt.Sprintf("Shards %v did not answer; their claims are missing.", shares.UnavailableShards)
		}
	}
	g.render(w, status, "queue", d)
}

func fmtG(f float64) string { return fmt.Sprintf("%.4g", f) }

func (g *Gateway) pageQueuePause(w http.ResponseWriter, r *http.Request)  { g.queueAction(w, r, true) }
func (g *Gateway) pageQueueResume(w http.ResponseWriter, r *http.Request) { g.queueAction(w, r, false) }

// queueAction pauses or resumes a queue on every shard from its page.
func (g *Gateway) queueAction(w http.ResponseWriter, r *http.Request, pause bool) {
	sess, p, rl, ok := g.consolePOST(w, r)
	if !ok {
		return
	}
	queue := r.PathValue("queue")
	action, done := "queue.resume", "resumed"
	if pause {
		action, done = "queue.pause", "paused"
	}
	switch {
	case rl != roleOperator:
		g.refuseAction(w, r, sess, p, rl, action, "", nil, fmt.Sprintf("Token %q may not pause or resume queues: they are for operators", p.Name))
		return
	case !p.Has(auth.WeightsWrite):
		g.refuseAction(w, r, sess, p, rl, action, queue, map[string]bool{"paused": pause},
			fmt.Sprintf("Token %q lacks the %s privilege", p.Name, auth.WeightsWrite))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), consoleTimeout)
	defer cancel()
	res, e := g.setQueuePaused(ctx, p.Name, queue, pause)
	d := base("Queue "+queue, sess, p, rl)
	if e != nil {
		d.Error = "Not " + done + ": " + e.Message
		g.queuePage(w, r, e.Status, d, p, queue, nil)
		return
	}
	if st := res.Status(); st != http.StatusOK {
		// Some shards did not take it: show which, on the page itself.
		d.Done = fmt.Sprintf("%s on some shards only.", strings.ToUpper(done[:1])+done[1:])
		g.queuePage(w, r, st, d, p, queue, &res)
		return
	}
	http.Redirect(w, r, queuePath(queue)+"?done="+done, http.StatusSeeOther)
}
