package console

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/tenantcap"
	"github.com/harvest-run/harvest/pkg/weights"
)

// The admission page (GET /admin for an operator): the algorithm, TFM and
// scheduled share and their forms, the priority ceilings, the running
// count of each tenant, the queues with weight overrides and the newest
// audit rows. Its forms go through the gateway (Backend), the same path
// as PUT /v1/admission and PUT /v1/tenants/{tenant}/priority.

type algoChoice struct {
	Value    string
	Label    string
	Selected bool
	Note     string
}

type tenantRow struct {
	Name    string
	Running int
}

type queueRow struct {
	Queue       string
	Overrides   []api.WeightOverride
	Uniform     bool
	Unavailable []int
}

type auditRow struct {
	When, Actor, Action, Where, NewValue, Outcome, Message string
	Shard                                                  int
}

// pageSave applies the form through the same path as PUT /v1/admission,
// audited with the token's name.
func (c *Console) pageSave(w http.ResponseWriter, r *http.Request) {
	sess, p, ok := c.postSession(w, r)
	if !ok {
		return
	}
	switch rl := roleOf(p); rl {
	case roleTenant:
		// The session stays: the tenant keeps its runs pages.
		c.forbidden(w, sess, p, rl, fmt.Sprintf("Token %q lacks the config:read privilege.", p.Name))
		return
	case roleNone:
		c.sessions.remove(sess.id)
		c.refused(w, fmt.Sprintf("Token %q lacks the config:read privilege.", p.Name))
		return
	}
	algo := r.PostForm.Get("algorithm")
	tfmText := strings.TrimSpace(r.PostForm.Get("tfm"))
	shareText := strings.TrimSpace(r.PostForm.Get("scheduled_share"))
	put := map[string]any{"algorithm": algo}
	number := func(field, text string) {
		if v, err := strconv.ParseFloat(text, 64); err == nil && !isNaNOrInf(v) {
			put[field] = v
		} else {
			put[field] = text // refused (and audited) as not a number
		}
	}
	number("tfm", tfmText)
	if shareText != "" {
		number("scheduled_share", shareText)
	}
	body, _ := json.Marshal(put)
	form := map[string]string{"algorithm": algo, "tfm": tfmText, "scheduled_share": shareText}
	if !p.Has(auth.ConfigWrite) {
		e := api.NewError(api.CodePermissionDenied, "token %q lacks the %s privilege", p.Name, auth.ConfigWrite)
		if err := tenantcap.RecordRefusal(r.Context(), c.shards[0], p.Name, body, e); err != nil {
			c.log.Warn("admission: cannot audit a refused change", "actor", p.Name, "err", err)
		}
		c.dashboard(w, r, http.StatusForbidden, sess, p, false, "Not saved: "+e.Message+".", form)
		return
	}
	if e := c.be.PutAdmission(r.Context(), p.Name, body); e != nil {
		c.dashboard(w, r, e.Status, sess, p, false, "Not saved: "+withField(e), form)
		return
	}
	http.Redirect(w, r, "/admin?saved=1", http.StatusSeeOther)
}

// withField is an error's message led by its field, unless the message
// already names it first.
func withField(e *api.Error) string {
	if e.Field != "" && !strings.HasPrefix(e.Message, e.Field) {
		return e.Field + ": " + e.Message
	}
	return e.Message
}

func isNaNOrInf(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) }

// algorithmNotes explain what the TFM does under each algorithm, with the
// figures in force.
func algorithmNotes(v api.AdmissionView, tfm float64) map[api.Algorithm]string {
	tenants := max(v.Tenants, 1)
	static, _ := tenantcap.Limit(tenantcap.Config{Algorithm: api.AlgorithmStatic, TFM: tfm}, v.MaxRuns, v.Tenants, v.RunningTotal)
	dynamic, _ := tenantcap.Limit(tenantcap.Config{Algorithm: api.AlgorithmDynamic, TFM: tfm}, v.MaxRuns, v.Tenants, v.RunningTotal)
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	return map[api.Algorithm]string{
		api.AlgorithmNoLimit: fmt.Sprintf("No-Limit: the TFM has no effect. A tenant may start runs until all %d Max Workflow Runs are in use. Suits one or two tenants.", v.MaxRuns),
		api.AlgorithmStatic: fmt.Sprintf("Static: each tenant may hold at most floor(Max Workflow Runs × TFM ÷ registered tenants) runs: floor(%d × %s ÷ %d) = %d now. "+
			"TFM 1 is an equal share; 3 to 4 lets a lone busy tenant use far more of the system, at the risk of crowding when several are busy.",
			v.MaxRuns, f(tfm), tenants, static),
		api.AlgorithmDynamic: fmt.Sprintf("Dynamic: a tenant may start a run while it holds fewer than TFM × (Max Workflow Runs − runs in flight): %s × (%d − %d), a limit of %d now. "+
			"The limit shrinks as the system fills, so light users still get in while heavy users wait. Recommended TFM: 3.",
			f(tfm), v.MaxRuns, v.RunningTotal, dynamic),
	}
}

// dashboard renders the admission page for a signed-in operator. form,
// when set, keeps the values of a form that was not saved.
func (c *Console) dashboard(w http.ResponseWriter, r *http.Request, status int, sess *session, p auth.Principal, saved bool, errMsg string, form map[string]string) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	d := pageData{Title: "Administration", SignedIn: true, Actor: p.Name, Operator: true, CSRF: sess.csrf, Saved: saved, Error: errMsg}
	view, e := c.be.Admission(ctx)
	if e != nil {
		d.Error = strings.TrimSpace(d.Error + " Counts unavailable: " + e.Message)
	}
	d.View = view
	selected, tfm := string(view.Algorithm), view.TFM
	d.TFMInput = strconv.FormatFloat(view.TFM, 'g', -1, 64)
	d.ShareInput = strconv.FormatFloat(view.ScheduledShare, 'g', -1, 64)
	d.Ceilings, d.CeilingDefault = view.PriorityCeilings, api.DefaultMaxPriority
	if form != nil {
		selected, d.TFMInput, d.ShareInput = form["algorithm"], form["tfm"], form["scheduled_share"]
		if v, err := strconv.ParseFloat(form["tfm"], 64); err == nil && v > 0 {
			tfm = v
		}
	}
	notes := algorithmNotes(view, tfm)
	for _, a := range tenantcap.Algorithms() {
		d.Algorithms = append(d.Algorithms, algoChoice{Value: string(a), Label: a.Label(), Selected: string(a) == selected, Note: notes[a]})
	}
	for t, n := range view.Running {
		d.Tenants = append(d.Tenants, tenantRow{Name: t, Running: n})
	}
	sort.Slice(d.Tenants, func(i, j int) bool { return d.Tenants[i].Name < d.Tenants[j].Name })
	d.Queues, d.QueuesTruncated = c.overrideQueues(ctx)
	if entries, unavailable, e := c.be.Audit(ctx, pageAudit); e == nil {
		d.AuditUnavailable = unavailable
		for _, a := range entries {
			row := auditRow{When: a.At.UTC().Format("2006-01-02 15:04:05"), Shard: a.Shard, Actor: a.Actor, Action: a.Action,
				NewValue: string(a.NewValue), Outcome: a.Outcome, Message: a.Message}
			if a.Queue != nil {
				row.Where = *a.Queue
				if a.Key != nil {
					row.Where += " / " + *a.Key
				}
			}
			d.Audit = append(d.Audit, row)
		}
	}
	c.render(w, status, "dashboard", d)
}

// weightShards is every shard in the form pkg/weights fans out over.
func (c *Console) weightShards() []weights.Shard {
	out := make([]weights.Shard, len(c.shards))
	for i, p := range c.shards {
		out[i] = weights.Shard{Index: i, DB: p}
	}
	return out
}

// overrideQueues lists the queues that hold weight overrides on any shard
// (at most pageQueues) with their overrides as GET /v1/queues/{q}/weights
// reports them.
func (c *Console) overrideQueues(ctx context.Context) ([]queueRow, bool) {
	names := map[string]bool{}
	// A shard that does not answer is listed as unavailable under each
	// queue (its queues cannot be known), and logged.
	answers := shards.Each(ctx, c.shards, nil, weights.DefaultShardTimeout,
		func(ctx context.Context, _ int, pool *pgxpool.Pool) ([]string, error) {
			return weights.Queues(ctx, pool, pageQueues+1)
		})
	missing := shards.Unavailable(answers)
	for _, a := range answers {
		if a.Err != nil {
			c.log.Warn("admin page: list the queues with overrides", "shard", a.Shard, "err", a.Err)
			continue
		}
		for _, q := range a.Value {
			names[q] = true
		}
	}
	var wg sync.WaitGroup
	list := slices.Sorted(maps.Keys(names))
	truncated := len(list) > pageQueues
	if truncated {
		list = list[:pageQueues]
	}
	out := make([]queueRow, len(list))
	for i, q := range list {
		wg.Go(func() {
			out[i] = queueRow{Queue: q, Uniform: true, Unavailable: missing}
			res, err := weights.Get(ctx, c.weightShards(), q)
			if err != nil {
				c.log.Warn("admin page: read the overrides of a queue", "queue", q, "err", err)
				return
			}
			out[i].Overrides, out[i].Uniform, out[i].Unavailable = res.Overrides, res.WeightsUniform, res.UnavailableShards
		})
	}
	wg.Wait()
	return out, truncated
}

// pagePriority sets (op=set) or clears (op=clear) a tenant's priority
// ceiling from the admission page, through the same path as PUT
// /v1/tenants/{tenant}/priority: the change writes its audit row, a
// refusal is audited here.
func (c *Console) pagePriority(w http.ResponseWriter, r *http.Request) {
	sess, p, ok := c.postSession(w, r)
	if !ok {
		return
	}
	switch rl := roleOf(p); rl {
	case roleTenant:
		c.forbidden(w, sess, p, rl, fmt.Sprintf("Token %q lacks the config:read privilege.", p.Name))
		return
	case roleNone:
		c.sessions.remove(sess.id)
		c.refused(w, fmt.Sprintf("Token %q lacks the config:read privilege.", p.Name))
		return
	}
	tenant := strings.TrimSpace(r.PostForm.Get("tenant"))
	maxText := strings.TrimSpace(r.PostForm.Get("max_priority"))
	clear := r.PostForm.Get("op") == "clear"
	attempted, _ := json.Marshal(map[string]any{"tenant": tenant, "max_priority": maxText, "clear": clear})
	refuse := func(e *api.Error) {
		if err := tenantcap.RecordCeilingRefusal(r.Context(), c.shards[0], p.Name, attempted, e); err != nil {
			c.log.Warn("admission: cannot audit a refused change", "actor", p.Name, "err", err)
		}
		c.dashboard(w, r, e.Status, sess, p, false, "Priority ceiling not changed: "+withField(e), nil)
	}
	if !p.Has(auth.ConfigWrite) {
		refuse(api.NewError(api.CodePermissionDenied, "token %q lacks the %s privilege", p.Name, auth.ConfigWrite))
		return
	}
	var maxPriority *int
	if !clear {
		n, err := strconv.Atoi(maxText)
		if err != nil {
			refuse(api.Invalid("max_priority", "max_priority must be an integer from %d to %d, not %q", api.MinPriority, api.MaxPriority, maxText))
			return
		}
		maxPriority = &n
	}
	if e := c.be.SetCeiling(r.Context(), p.Name, tenant, maxPriority); e != nil {
		refuse(e)
		return
	}
	http.Redirect(w, r, "/admin?saved=1", http.StatusSeeOther)
}
