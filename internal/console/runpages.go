package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/weights"
)

// The runs pages: the runs of every shard (ListRuns) and one run with its
// tasks, and the run's cancel and retry, which go through the gateway
// (Backend) as POST /v1/runs/{id}/cancel and /retry do. A tenant's session
// sees and acts on its own tenant's runs only.

// Bounds of the runs and queues pages.
const (
	pageRuns     = 50
	pageKeys     = 200
	maxFilterLen = 256
	pageTimeout  = 10 * time.Second
)

type runsView struct {
	Tenant, Queue, Status, Name string
	Statuses                    []statusChoice
	Runs                        []runLine
	NextURL                     string
	Unavailable                 []int
}

type statusChoice struct {
	Value    string
	Selected bool
}

type runLine struct {
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
	Tasks       []taskLine
	Action      string // base path of the run's forms
	CanCancel   bool
	CanRetry    bool
}

type taskLine struct {
	ID                                 int64
	Step, Attempt                      int
	State, ClaimedBy, ClaimedAt, DueAt string
	CreatedAt                          string
}

// runPath is the page of one run, its parts escaped for a path.
func runPath(tenant, id string) string {
	return "/admin/runs/" + url.PathEscape(tenant) + "/" + url.PathEscape(id)
}

func (c *Console) pageRuns(w http.ResponseWriter, r *http.Request) {
	sess, p, rl, ok := c.sessionGET(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	v := &runsView{Tenant: strings.TrimSpace(q.Get("tenant")), Queue: strings.TrimSpace(q.Get("queue")),
		Status: strings.TrimSpace(q.Get("status")), Name: strings.TrimSpace(q.Get("name"))}
	if rl == roleTenant {
		if v.Tenant != "" && v.Tenant != p.Tenant {
			c.forbidden(w, sess, p, rl, fmt.Sprintf("Token %q may list the runs of its own tenant only.", p.Name))
			return
		}
		v.Tenant = p.Tenant
	}
	// The filter offers every status, in the order of a run's life.
	for _, s := range api.Statuses() {
		v.Statuses = append(v.Statuses, statusChoice{Value: string(s), Selected: string(s) == v.Status})
	}
	d := base("Runs", sess, p, rl)
	d.Live, d.Runs = true, v
	status := http.StatusOK
	f := RunFilter{Tenant: v.Tenant, Queue: v.Queue, Name: v.Name, Cursor: q.Get("cursor"), Limit: pageRuns}
	switch {
	case len(v.Tenant) > maxFilterLen || len(v.Queue) > maxFilterLen || len(v.Name) > maxFilterLen || len(f.Cursor) > 4*maxFilterLen:
		d.Error, status = "A filter is too long.", http.StatusBadRequest
	case v.Status != "" && !api.Status(v.Status).Known():
		d.Error, status = fmt.Sprintf("Unknown status %q.", v.Status), http.StatusBadRequest
	}
	if v.Status != "" {
		f.Statuses = []api.Status{api.Status(v.Status)}
	}
	if status == http.StatusOK && rl == roleTenant {
		// A tenant's listings share its bound with its API listings.
		leave, e := c.be.EnterRunList(r.Context(), p.Tenant)
		if e != nil {
			if e.RetryAfterMS > 0 {
				w.Header().Set("Retry-After", strconv.FormatInt(e.RetryAfterSeconds(), 10))
			}
			d.Error, status = e.Message, http.StatusTooManyRequests
		} else {
			defer leave()
		}
	}
	if status == http.StatusOK {
		ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
		defer cancel()
		page, err := ListRuns(ctx, c.shards, f)
		if err != nil {
			d.Error, status = c.readError(err, "list runs")
		}
		v.Unavailable = page.UnavailableShards
		for _, run := range page.Runs {
			if rl == roleTenant && run.Tenant != p.Tenant {
				// The filter already keeps to the tenant; this guards the
				// page against a listing that did not.
				continue
			}
			v.Runs = append(v.Runs, runLine{ID: run.ID, Tenant: run.Tenant, Name: run.Name, Queue: run.Queue,
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
	c.render(w, status, "runs", d)
}

// readError is the message and status of an error of the console
// package: a bad filter or cursor is the caller's (400); anything else is
// told as unavailable, with the detail in the log only.
func (c *Console) readError(err error, what string) (string, int) {
	var ae *api.Error
	switch {
	case errors.Is(err, ErrBadCursor):
		return "The page cursor is not one this console made; start from the first page.", http.StatusBadRequest
	case errors.As(err, &ae):
		return ae.Message, ae.Status
	}
	c.log.Warn("console page: "+what, "err", err)
	return "Cannot " + what + " now: " + err.Error(), http.StatusServiceUnavailable
}

// runAccess checks that the session may look at the runs of tenant: a
// tenant session only at its own.
func (c *Console) runAccess(w http.ResponseWriter, sess *session, p auth.Principal, rl role, tenant string) bool {
	if rl == roleTenant && tenant != p.Tenant {
		c.forbidden(w, sess, p, rl, fmt.Sprintf("Token %q may see the runs of its own tenant only.", p.Name))
		return false
	}
	return true
}

func (c *Console) pageRun(w http.ResponseWriter, r *http.Request) {
	sess, p, rl, ok := c.sessionGET(w, r)
	if !ok {
		return
	}
	tenant, id := r.PathValue("tenant"), r.PathValue("id")
	if !c.runAccess(w, sess, p, rl, tenant) {
		return
	}
	d := base("Run "+id, sess, p, rl)
	switch r.URL.Query().Get("done") {
	case "cancelled":
		d.Done = "Cancelled."
	case "retried":
		d.Done = "Put back in its queue for another attempt."
	}
	c.runPage(w, r, http.StatusOK, d, p, rl, tenant, id)
}

// runPage reads the run and renders its page with status (or the status
// the read answers: 404, 503...). d carries any message of an action.
func (c *Console) runPage(w http.ResponseWriter, r *http.Request, status int, d pageData, p auth.Principal, rl role, tenant, id string) {
	v := &runView{Tenant: tenant, ID: id, Action: runPath(tenant, id)}
	d.Live, d.Run = true, v
	if auth.ValidateTenant(tenant) != nil || id == "" || len(id) > maxFilterLen {
		d.Error = "No such run."
		c.render(w, http.StatusNotFound, "run", d)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
	defer cancel()
	if !c.be.KnownTenant(ctx, tenant) {
		d.Error = "No such run."
		c.render(w, http.StatusNotFound, "run", d)
		return
	}
	detail, shard, err := c.be.InspectRun(ctx, tenant, id)
	var ae *api.Error
	switch {
	case errors.Is(err, runstore.ErrNotFound):
		d.Error = "No such run."
		c.render(w, http.StatusNotFound, "run", d)
		return
	case errors.As(err, &ae) && ae.Code != api.CodeInternal:
		d.Error = strings.TrimSpace(d.Error + " " + ae.Message)
		c.render(w, ae.Status, "run", d)
		return
	case err != nil:
		// The gateway's own failure: told as unavailable, as the API
		// would not, so that the operator sees what failed.
		d.Error = strings.TrimSpace(d.Error + " Cannot read the run now: " + err.Error())
		c.render(w, http.StatusServiceUnavailable, "run", d)
		return
	}
	run := detail.Run
	if rl == roleOperator && run.Waiting != nil && run.Waiting.Reason == api.WaitQueuePaused {
		// The waiting object names no operator (a tenant reads it too);
		// an operator sees whose pause holds the run.
		if ps, err := weights.PausedOne(ctx, c.shards[shard], run.Queue); err == nil && ps != nil {
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
	v.TraceID, v.TraceLink = detail.TraceID, c.traceLink(detail.TraceID)
	for i, t := range detail.Tasks {
		if i == 200 {
			break
		}
		row := taskLine{ID: t.ID, Step: t.Step, Attempt: t.Attempt, State: t.State, ClaimedBy: t.ClaimedBy,
			DueAt: utc(t.DueAt), CreatedAt: utc(t.CreatedAt)}
		if t.ClaimedAt != nil {
			row.ClaimedAt = utc(*t.ClaimedAt)
		}
		v.Tasks = append(v.Tasks, row)
	}
	v.CanCancel = !run.Status.Final()
	v.CanRetry = run.Status == api.StatusFailed || run.Status == api.StatusCancelled
	c.render(w, status, "run", d)
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

func (c *Console) pageRunCancel(w http.ResponseWriter, r *http.Request) { c.runAction(w, r, "cancel") }
func (c *Console) pageRunRetry(w http.ResponseWriter, r *http.Request)  { c.runAction(w, r, "retry") }

// runAction cancels or retries a run from its page, then sends the browser
// back to the page (303), or shows the page again with the refusal.
func (c *Console) runAction(w http.ResponseWriter, r *http.Request, what string) {
	sess, p, rl, ok := c.sessionPOST(w, r)
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
		c.refuseAction(w, r, sess, p, rl, "run."+what, "", attempted, why)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), pageTimeout)
	defer cancel()
	if !c.be.KnownTenant(ctx, tenant) {
		// The run's page answers 404 for it, without placing it.
		c.runPage(w, r, http.StatusNotFound, base("Run "+id, sess, p, rl), p, rl, tenant, id)
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
			c.log.Info("console: run cancelled by an operator", "actor", p.Name, "tenant", tenant, "id", id)
		}
		e = c.be.CancelRun(ctx, tenant, id, "cancelled by "+by+" in the console")
	} else {
		done = "retried"
		e = c.be.RetryRun(ctx, p.Name, tenant, id)
	}
	if e != nil {
		d := base("Run "+id, sess, p, rl)
		verb := map[string]string{"cancel": "Not cancelled", "retry": "Not retried"}[what]
		d.Error = verb + ": " + e.Message
		c.runPage(w, r, e.Status, d, p, rl, tenant, id)
		return
	}
	http.Redirect(w, r, runPath(tenant, id)+"?done="+done, http.StatusSeeOther)
}
