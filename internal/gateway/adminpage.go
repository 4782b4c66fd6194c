package gateway

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"net/url"
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

// The administration page: a few server-rendered pages (html/template,
// embedded) behind a sign-in with a bearer token.
//
//	GET  /admin            the page, or the sign-in form without a session
//	POST /admin/login      sign in (form: token, csrf)
//	POST /admin/admission  save algorithm and TFM (form: algorithm, tfm, csrf)
//	POST /admin/logout     sign out (form: csrf)
//
// The runs and queues pages of the console are in console_pages.go. An
// operator's token (config:read) gets the admission page and the console;
// a tenant's token with runs:read gets a session that sees only its own
// runs (GET /admin sends it there).
//
// Sessions: see session.go. CSRF: the sign-in form carries a value this
// gateway signed, with an expiry, that must also match a short-lived cookie
// of the same value (double submit); once signed in, every form carries the
// session's own CSRF token, checked on every POST. Cookies are HttpOnly and
// SameSite=Strict, and Secure over TLS (see secureCookies).

//go:embed templates/*.html
var templateFiles embed.FS

const (
	sessionCookie = "harvest_admin"
	loginCookie   = "harvest_admin_login"
	// maxFormBytes bounds the body of every console request: the forms
	// hold a CSRF value, a token and a few short fields.
	maxFormBytes = 16 << 10
	// Bounds of what the page lists.
	pageQueues = 50
	pageAudit  = 20
)

var adminTemplates = func() map[string]*template.Template {
	funcs := template.FuncMap{
		"fmtFloat":   func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) },
		"deref":      func(p *int) int { return *p },
		"pathEscape": url.PathEscape,
	}
	out := map[string]*template.Template{}
	for _, page := range []string{"signin", "refused", "dashboard", "runs", "run", "queues", "queue"} {
		out[page] = template.Must(template.New("").Funcs(funcs).ParseFS(templateFiles,
			"templates/layout.html", "templates/"+page+".html"))
	}
	return out
}()

func (g *Gateway) pageRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /admin", g.pageAdmin)
	mux.HandleFunc("GET /admin/{$}", g.pageAdmin)
	mux.HandleFunc("POST /admin/login", g.pageLogin)
	mux.HandleFunc("POST /admin/admission", g.pageSave)
	mux.HandleFunc("POST /admin/priority", g.pagePriority)
	mux.HandleFunc("POST /admin/logout", g.pageLogout)
	mux.HandleFunc("GET /admin/runs", g.pageRuns)
	mux.HandleFunc("GET /admin/runs/{tenant}/{id}", g.pageRun)
	mux.HandleFunc("POST /admin/runs/{tenant}/{id}/cancel", g.pageRunCancel)
	mux.HandleFunc("POST /admin/runs/{tenant}/{id}/retry", g.pageRunRetry)
	mux.HandleFunc("GET /admin/queues", g.pageQueues)
	mux.HandleFunc("GET /admin/queues/{queue}", g.pageQueue)
	mux.HandleFunc("POST /admin/queues/{queue}/pause", g.pageQueuePause)
	mux.HandleFunc("POST /admin/queues/{queue}/resume", g.pageQueueResume)
	mux.HandleFunc("POST /admin/queues/{queue}/fairness", g.pageQueueFairness)
	mux.HandleFunc("POST /admin/queues/{queue}/group-weights", g.pageQueueGroupWeight)
}

// pageData is what every page template sees.
type pageData struct {
	Title      string
	Nonce      string
	SignedIn   bool
	Actor      string
	CSRF       string
	Error      string
	SessionTTL string
	// Tenant is set for a tenant's session; Operator for an operator's
	// (config:read). They decide the navigation.
	Tenant   string
	Operator bool
	// Live adds the live-refresh switch and its script (console pages).
	Live bool
	// Done confirms an action that was carried out.
	Done string

	// One of these for the console pages (console_pages.go).
	Runs      *runsView
	Run       *runView
	QueueList *queuesView
	Queue     *queueView

	// Dashboard only.
	Saved            bool
	View             tenantcap.AdmissionView
	Algorithms       []algoChoice
	TFMInput         string
	ShareInput       string
	Ceilings         []api.PriorityCeiling
	CeilingDefault   int
	Tenants          []tenantRow
	Queues           []queueRow
	QueuesTruncated  bool
	Audit            []auditRow
	AuditUnavailable []int
}

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
	Overrides   []weights.Override
	Uniform     bool
	Unavailable []int
}

type auditRow struct {
	When, Actor, Action, Where, NewValue, Outcome, Message string
	Shard                                                  int
}

// render writes one page with headers that keep it out of caches and
// frames and allow only its own inline style and script (by nonce).
func (g *Gateway) render(w http.ResponseWriter, status int, page string, d pageData) {
	d.Nonce = randomToken()
	d.SessionTTL = g.cfg.AdminSession.String()
	var buf bytes.Buffer
	if err := adminTemplates[page].ExecuteTemplate(&buf, "layout", d); err != nil {
		g.log.Error("admin page: render", "page", page, "err", err)
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Content-Security-Policy", fmt.Sprintf(
		"default-src 'none'; style-src 'nonce-%s'; script-src 'nonce-%s'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
		d.Nonce, d.Nonce))
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (g *Gateway) setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: value, Path: "/admin", MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: g.secureCookies(r),
	})
}

// secureCookies says whether the page's cookies get the Secure flag: when
// the gateway terminates TLS itself, when a proxy in front says it did
// (X-Forwarded-Proto: https; a forged header can only make the cookie
// stricter), or always with HARVEST_GATEWAY_COOKIE_SECURE=always.
func (g *Gateway) secureCookies(r *http.Request) bool {
	return g.cfg.CookieSecure == CookieSecureAlways || r.TLS != nil ||
		strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// signIn shows the sign-in form with a fresh CSRF value, which this
// gateway signed and which must also come back in a cookie (double
// submit).
func (g *Gateway) signIn(w http.ResponseWriter, r *http.Request, status int, msg string) {
	csrf := g.sessions.issueLogin()
	g.setCookie(w, r, loginCookie, csrf, int(loginTTL/time.Second))
	g.render(w, status, "signin", pageData{Title: "Sign in", CSRF: csrf, Error: msg})
}

// refused shows the 403 page: nothing of the configuration.
func (g *Gateway) refused(w http.ResponseWriter, msg string) {
	g.render(w, http.StatusForbidden, "refused", pageData{Title: "Access refused", Error: msg})
}

// current returns the request's live session and its principal. A session
// whose token no longer authenticates is ended. ok is false when there is
// no usable session.
func (g *Gateway) current(r *http.Request) (*session, auth.Principal, bool) {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil, auth.Principal{}, false
	}
	sess, ok := g.sessions.get(c.Value)
	if !ok {
		return nil, auth.Principal{}, false
	}
	p, err := g.tokens.Authenticate(sess.secret)
	if err != nil {
		g.sessions.remove(sess.id)
		return nil, auth.Principal{}, false
	}
	return sess, p, true
}

func (g *Gateway) pageAdmin(w http.ResponseWriter, r *http.Request) {
	sess, p, ok := g.current(r)
	if !ok {
		msg := ""
		if _, err := r.Cookie(sessionCookie); err == nil {
			msg = "Your session has ended; sign in again."
			g.setCookie(w, r, sessionCookie, "", -1)
		}
		g.signIn(w, r, http.StatusOK, msg)
		return
	}
	switch consoleRole(p) {
	case roleTenant:
		// A tenant's session has no dashboard: its page is its runs.
		http.Redirect(w, r, "/admin/runs", http.StatusSeeOther)
		return
	case roleNone:
		g.sessions.remove(sess.id)
		g.setCookie(w, r, sessionCookie, "", -1)
		g.refused(w, fmt.Sprintf("Token %q lacks the config:read privilege, and is not a tenant's token with runs:read.", p.Name))
		return
	}
	g.dashboard(w, r, http.StatusOK, sess, p, r.URL.Query().Get("saved") == "1", "", nil)
}

// parseForm reads a small urlencoded form. The body is already capped at
// maxFormBytes for every console route (limitBodies), so this reads no
// more than that whatever the client sends; past it the answer is 413.
func (g *Gateway) parseForm(w http.ResponseWriter, r *http.Request) bool {
	if err := r.ParseForm(); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			g.formTooLarge(w)
			return false
		}
		http.Error(w, "bad form", http.StatusBadRequest)
		return false
	}
	return true
}

// formTooLarge is the console's answer to a body larger than its forms
// take.
func (g *Gateway) formTooLarge(w http.ResponseWriter) {
	g.render(w, http.StatusRequestEntityTooLarge, "refused", pageData{Title: "Request too large",
		Error: fmt.Sprintf("The request is larger than the console's forms take (%d bytes).", maxFormBytes)})
}

// pageLogin signs a browser in. The sign-in form's signed value is checked
// in its cookie before the body is read, so a caller that did not load the
// form from this gateway gets its 403 without sending the gateway a byte
// of its body.
func (g *Gateway) pageLogin(w http.ResponseWriter, r *http.Request) {
	c, err := r.Cookie(loginCookie)
	if err != nil || !g.sessions.checkLogin(c.Value) {
		g.signIn(w, r, http.StatusForbidden, "The sign-in form expired or did not come from this page; try again.")
		return
	}
	if !g.parseForm(w, r) {
		return
	}
	if !sameToken(r.PostForm.Get("csrf"), c.Value) {
		g.signIn(w, r, http.StatusForbidden, "The sign-in form expired or did not come from this page; try again.")
		return
	}
	secret := strings.TrimSpace(r.PostForm.Get("token"))
	p, err := g.tokens.Authenticate(secret)
	if secret == "" || err != nil {
		g.signIn(w, r, http.StatusUnauthorized, "Unknown token.")
		return
	}
	rl := consoleRole(p)
	if rl == roleNone {
		g.setCookie(w, r, loginCookie, "", -1)
		g.refused(w, fmt.Sprintf("Token %q lacks the config:read privilege, and is not a tenant's token with runs:read: the console is for operators and tenants only.", p.Name))
		return
	}
	sess, retry, err := g.sessions.create(secret, sessionOwner{operator: rl == roleOperator, principal: p.Name},
		sessionLimits{perPrincipal: g.cfg.AdminSessionsPerToken, signInsPerMinute: g.cfg.AdminSignInsPerMinute})
	if err != nil {
		secs := max(int64((retry+time.Second-1)/time.Second), 1)
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		if errors.Is(err, errSignInPace) {
			g.signIn(w, r, http.StatusTooManyRequests, fmt.Sprintf("Token %q signed in too often lately; try again in %d seconds.", p.Name, secs))
			return
		}
		g.signIn(w, r, http.StatusServiceUnavailable, fmt.Sprintf("This gateway holds as many console sessions as it can; try again in %d seconds.", secs))
		return
	}
	g.setCookie(w, r, loginCookie, "", -1)
	g.setCookie(w, r, sessionCookie, sess.id, int(g.cfg.AdminSession/time.Second))
	if rl == roleTenant {
		http.Redirect(w, r, "/admin/runs", http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, "/admin", http.StatusSeeOther)
}

// postSession checks the session and the CSRF token of a signed-in form.
// The session, which is in the cookie, is checked before the form is read:
// a caller without one gets its 401 page without the gateway reading its
// body.
func (g *Gateway) postSession(w http.ResponseWriter, r *http.Request) (*session, auth.Principal, bool) {
	sess, p, ok := g.current(r)
	if !ok {
		g.setCookie(w, r, sessionCookie, "", -1)
		g.signIn(w, r, http.StatusUnauthorized, "Your session has ended; sign in again.")
		return nil, auth.Principal{}, false
	}
	if !g.parseForm(w, r) {
		return nil, auth.Principal{}, false
	}
	if !sameToken(r.PostForm.Get("csrf"), sess.csrf) {
		g.refused(w, "The form did not come from this session (CSRF check failed); reload the page and try again.")
		return nil, auth.Principal{}, false
	}
	return sess, p, true
}

func (g *Gateway) pageLogout(w http.ResponseWriter, r *http.Request) {
	sess, _, ok := g.postSession(w, r)
	if !ok {
		return
	}
	g.sessions.remove(sess.id)
	g.setCookie(w, r, sessionCookie, "", -1)
	http.Redirect(w, r, "/admin", http.StatusSeeOther)
}

// pageSave applies the form through the same path as PUT /v1/admission,
// audited with the token's name.
func (g *Gateway) pageSave(w http.ResponseWriter, r *http.Request) {
	sess, p, ok := g.postSession(w, r)
	if !ok {
		return
	}
	switch rl := consoleRole(p); rl {
	case roleTenant:
		// The session stays: the tenant keeps its runs pages.
		g.forbidden(w, sess, p, rl, fmt.Sprintf("Token %q lacks the config:read privilege.", p.Name))
		return
	case roleNone:
		g.sessions.remove(sess.id)
		g.refused(w, fmt.Sprintf("Token %q lacks the config:read privilege.", p.Name))
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
		if err := tenantcap.RecordRefusal(r.Context(), g.shards[0], p.Name, body, e); err != nil {
			g.log.Warn("admission: cannot audit a refused change", "actor", p.Name, "err", err)
		}
		g.dashboard(w, r, http.StatusForbidden, sess, p, false, "Not saved: "+e.Message+".", form)
		return
	}
	if _, e := g.putAdmission(r.Context(), p.Name, body); e != nil {
		msg := e.Message
		if e.Field != "" && !strings.HasPrefix(msg, e.Field) {
			msg = e.Field + ": " + msg
		}
		g.dashboard(w, r, e.Status, sess, p, false, "Not saved: "+msg, form)
		return
	}
	http.Redirect(w, r, "/admin?saved=1", http.StatusSeeOther)
}

func isNaNOrInf(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) }

// algorithmNotes explain what the TFM does under each algorithm, with the
// figures in force.
func algorithmNotes(v tenantcap.AdmissionView, tfm float64) map[tenantcap.Algorithm]string {
	tenants := max(v.Tenants, 1)
	static, _ := tenantcap.Limit(tenantcap.Config{Algorithm: tenantcap.Static, TFM: tfm}, v.MaxRuns, v.Tenants, v.RunningTotal)
	dynamic, _ := tenantcap.Limit(tenantcap.Config{Algorithm: tenantcap.Dynamic, TFM: tfm}, v.MaxRuns, v.Tenants, v.RunningTotal)
	f := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	return map[tenantcap.Algorithm]string{
		tenantcap.NoLimit: fmt.Sprintf("No-Limit: the TFM has no effect. A tenant may start runs until all %d Max Workflow Runs are in use. Suits one or two tenants.", v.MaxRuns),
		tenantcap.Static: fmt.Sprintf("Static: each tenant may hold at most floor(Max Workflow Runs × TFM ÷ registered tenants) runs: floor(%d × %s ÷ %d) = %d now. "+
			"TFM 1 is an equal share; 3 to 4 lets a lone busy tenant use far more of the system, at the risk of crowding when several are busy.",
			v.MaxRuns, f(tfm), tenants, static),
		tenantcap.Dynamic: fmt.Sprintf("Dynamic: a tenant may start a run while it holds fewer than TFM × (Max Workflow Runs − runs in flight): %s × (%d − %d), a limit of %d now. "+
			"The limit shrinks as the system fills, so light users still get in while heavy users wait. Recommended TFM: 3.",
			f(tfm), v.MaxRuns, v.RunningTotal, dynamic),
	}
}

// dashboard renders the page for a signed-in administrator. form, when
// set, keeps the values of a form that was not saved.
func (g *Gateway) dashboard(w http.ResponseWriter, r *http.Request, status int, sess *session, p auth.Principal, saved bool, errMsg string, form map[string]string) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	d := pageData{Title: "Administration", SignedIn: true, Actor: p.Name, Operator: true, CSRF: sess.csrf, Saved: saved, Error: errMsg}
	view, e := g.admissionView(ctx)
	if e != nil {
		cur := g.adm.watcher.Current()
		view = tenantcap.AdmissionView{Algorithm: cur.Algorithm, TFM: cur.TFM, MaxRuns: g.adm.adm.MaxRuns(), MaxRunsReadOnly: true}
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
	d.Queues, d.QueuesTruncated = g.overrideQueues(ctx)
	if page, e := g.auditPage(ctx, "", pageAudit, -1); e == nil {
		d.AuditUnavailable = page.UnavailableShards
		for _, a := range page.Entries {
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
	g.render(w, status, "dashboard", d)
}

// overrideQueues lists the queues that hold weight overrides on any shard
// (at most pageQueues) with their overrides as GET /v1/queues/{q}/weights
// reports them.
func (g *Gateway) overrideQueues(ctx context.Context) ([]queueRow, bool) {
	names := map[string]bool{}
	// A shard that does not answer is listed as unavailable under each
	// queue (its queues cannot be known), and logged.
	var missing []int
	for _, a := range shards.Each(ctx, g.shards, nil, weights.DefaultShardTimeout,
		func(ctx context.Context, _ int, pool *pgxpool.Pool) ([]string, error) {
			return weights.Queues(ctx, pool, pageQueues+1)
		}) {
		if a.Err != nil {
			missing = append(missing, a.Shard)
			g.log.Warn("admin page: list the queues with overrides", "shard", a.Shard, "err", a.Err)
			continue
		}
		for _, q := range a.Value {
			names[q] = true
		}
	}
	var wg sync.WaitGroup
	list := sortedKeys(names)
	truncated := len(list) > pageQueues
	if truncated {
		list = list[:pageQueues]
	}
	out := make([]queueRow, len(list))
	for i, q := range list {
		wg.Go(func() {
			out[i] = queueRow{Queue: q, Uniform: true, Unavailable: missing}
			res, err := weights.Get(ctx, g.weightShards(), q)
			if err != nil {
				g.log.Warn("admin page: read the overrides of a queue", "queue", q, "err", err)
				return
			}
			out[i].Overrides, out[i].Uniform, out[i].Unavailable = res.Overrides, res.WeightsUniform, res.UnavailableShards
		})
	}
	wg.Wait()
	return out, truncated
}

// pagePriority sets (op=set) or clears (op=clear) a tenant's priority
// ceiling from the administration page, through the same store as PUT
// /v1/tenants/{tenant}/priority: the change writes its audit row, a
// refusal is audited here.
func (g *Gateway) pagePriority(w http.ResponseWriter, r *http.Request) {
	sess, p, ok := g.postSession(w, r)
	if !ok {
		return
	}
	switch rl := consoleRole(p); rl {
	case roleTenant:
		g.forbidden(w, sess, p, rl, fmt.Sprintf("Token %q lacks the config:read privilege.", p.Name))
		return
	case roleNone:
		g.sessions.remove(sess.id)
		g.refused(w, fmt.Sprintf("Token %q lacks the config:read privilege.", p.Name))
		return
	}
	tenant := strings.TrimSpace(r.PostForm.Get("tenant"))
	maxText := strings.TrimSpace(r.PostForm.Get("max_priority"))
	clear := r.PostForm.Get("op") == "clear"
	attempted, _ := json.Marshal(map[string]any{"tenant": tenant, "max_priority": maxText, "clear": clear})
	refuse := func(e *api.Error) {
		if err := tenantcap.RecordCeilingRefusal(r.Context(), g.shards[0], p.Name, attempted, e); err != nil {
			g.log.Warn("admission: cannot audit a refused change", "actor", p.Name, "err", err)
		}
		msg := e.Message
		if e.Field != "" && !strings.HasPrefix(msg, e.Field) {
			msg = e.Field + ": " + msg
		}
		g.dashboard(w, r, e.Status, sess, p, false, "Priority ceiling not changed: "+msg, nil)
	}
	if !p.Has(auth.ConfigWrite) {
		refuse(api.NewError(api.CodePermissionDenied, "token %q lacks the %s privilege", p.Name, auth.ConfigWrite))
		return
	}
	var (
		c   api.PriorityCeiling
		err error
	)
	if clear {
		c, err = tenantcap.ClearCeiling(r.Context(), g.shards[0], p.Name, tenant)
	} else if n, perr := strconv.Atoi(maxText); perr != nil {
		err = api.Invalid("max_priority", "max_priority must be an integer from %d to %d, not %q", api.MinPriority, api.MaxPriority, maxText)
	} else {
		c, err = tenantcap.SetCeiling(r.Context(), g.shards[0], p.Name, tenant, n)
	}
	if err != nil {
		refuse(g.apiError(err, 0, "priority ceiling"))
		return
	}
	g.ceilingChanged(r.Context(), c)
	http.Redirect(w, r, "/admin?saved=1", http.StatusSeeOther)
}
