package console

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/weights"
)

// The pages, each a GET of a server-rendered page or a POST of a form that
// answers with a redirect (303) or the page again with what went wrong:
//
//	GET  /admin                               the admission page, or the sign-in form without a session (signin.go, admission.go)
//	POST /admin/login                         sign in (form: token, csrf)
//	POST /admin/logout                        sign out (form: csrf)
//	POST /admin/admission                     save algorithm, TFM and scheduled share (form: algorithm, tfm, scheduled_share, csrf)
//	POST /admin/priority                      set or clear a tenant's priority ceiling (form: tenant, max_priority, op, csrf)
//	GET  /admin/runs                          runs, filtered (tenant, queue, status, name), paged (runpages.go)
//	GET  /admin/runs/{tenant}/{id}            one run with its tasks
//	POST /admin/runs/{tenant}/{id}/cancel     cancel it (form: csrf)
//	POST /admin/runs/{tenant}/{id}/retry      retry it (form: csrf)
//	GET  /admin/queues                        queues of every shard (queuepages.go)
//	GET  /admin/queues/{queue}                one queue: depths, pause, keys, fairness, share chart
//	POST /admin/queues/{queue}/pause          pause it on every shard (form: csrf)
//	POST /admin/queues/{queue}/resume         resume it (form: csrf)
//	POST /admin/queues/{queue}/fairness       change its fairness modes (fairness.go)
//	POST /admin/queues/{queue}/group-weights  set or clear a group's weight
//
// Two kinds of session use them. An operator's token (no tenant,
// config:read) gets every page; the queues pages also need weights:read,
// and the actions config:write (admission, ceilings, runs) or
// weights:write (queues). A tenant's token holding runs:read gets a
// tenant session: its own runs only, cancel and retry with runs:start, and
// none of the operator's pages.
//
// CSRF: the sign-in form carries a value this console signed, with an
// expiry, that must also match a short-lived cookie of the same value
// (double submit); once signed in, every form carries the session's own
// CSRF token, checked on every POST. Cookies are HttpOnly and
// SameSite=Strict, and Secure over TLS (see secureCookies).

//go:embed templates/*.html
var templateFiles embed.FS

const (
	sessionCookie = "harvest_admin"
	loginCookie   = "harvest_admin_login"
	// Bounds of what the admission page lists.
	pageQueues = 50
	pageAudit  = 20
)

// MaxFormBytes bounds the body of every console request: the forms hold a
// CSRF value, a token and a few short fields. The gateway caps the body
// at this before the console's handler runs (its limitBodies), so that
// nothing the pages call reads more.
const MaxFormBytes = 16 << 10

var templates = func() map[string]*template.Template {
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

// Options are what a Console is made of.
type Options struct {
	// Backend is the gateway's side of the pages.
	Backend Backend
	// Shards are the pools of every shard in shard order, which the pages
	// read directly (runs, queues, keys, claim shares, overrides) and
	// write refusals' audit rows to (shard 0).
	Shards []*pgxpool.Pool
	// SessionTTL is the lifetime of a sign-in (HARVEST_GATEWAY_ADMIN_SESSION);
	// zero means 30 minutes.
	SessionTTL time.Duration
	// SessionsPerToken and SignInsPerMinute bound each token's sessions
	// and the pace of its sign-ins
	// (HARVEST_GATEWAY_ADMIN_SESSIONS_PER_TOKEN,
	// HARVEST_GATEWAY_ADMIN_SIGNINS_PER_MINUTE).
	SessionsPerToken int
	SignInsPerMinute int
	// AlwaysSecure sets the Secure flag on every cookie, not only over
	// TLS (HARVEST_GATEWAY_COOKIE_SECURE=always).
	AlwaysSecure bool
	// TraceLink turns a trace id into a link to the trace, or "" for none.
	// Nil shows trace ids without links.
	TraceLink func(traceID string) string
	// NotFound answers a path or method under /admin that no page serves.
	// Nil means http.NotFound.
	NotFound http.Handler
	// Now is the clock of the sessions; nil means time.Now.
	Now func() time.Time
	// Log receives the console's log lines; nil means slog.Default().
	Log *slog.Logger
}

// Console serves the pages under /admin. Its sessions live in its memory,
// so one Console serves every request of a process: make it once.
type Console struct {
	be        Backend
	shards    []*pgxpool.Pool
	sessions  *sessionStore
	limits    sessionLimits
	ttl       time.Duration
	secure    bool
	traceLink func(string) string
	log       *slog.Logger
	mux       *http.ServeMux
}

// New makes a console.
func New(o Options) *Console {
	c := &Console{be: o.Backend, shards: o.Shards, ttl: o.SessionTTL, secure: o.AlwaysSecure, traceLink: o.TraceLink, log: o.Log,
		limits: sessionLimits{perPrincipal: o.SessionsPerToken, signInsPerMinute: o.SignInsPerMinute}}
	if c.ttl <= 0 {
		c.ttl = 30 * time.Minute
	}
	if c.traceLink == nil {
		c.traceLink = func(string) string { return "" }
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	now := o.Now
	if now == nil {
		now = time.Now
	}
	c.sessions = newSessionStore(c.ttl, now)
	notFound := o.NotFound
	if notFound == nil {
		notFound = http.NotFoundHandler()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /admin", c.pageAdmin)
	mux.HandleFunc("GET /admin/{$}", c.pageAdmin)
	mux.HandleFunc("POST /admin/login", c.pageLogin)
	mux.HandleFunc("POST /admin/admission", c.pageSave)
	mux.HandleFunc("POST /admin/priority", c.pagePriority)
	mux.HandleFunc("POST /admin/logout", c.pageLogout)
	mux.HandleFunc("GET /admin/runs", c.pageRuns)
	mux.HandleFunc("GET /admin/runs/{tenant}/{id}", c.pageRun)
	mux.HandleFunc("POST /admin/runs/{tenant}/{id}/cancel", c.pageRunCancel)
	mux.HandleFunc("POST /admin/runs/{tenant}/{id}/retry", c.pageRunRetry)
	mux.HandleFunc("GET /admin/queues", c.pageQueues)
	mux.HandleFunc("GET /admin/queues/{queue}", c.pageQueue)
	mux.HandleFunc("POST /admin/queues/{queue}/pause", c.pageQueuePause)
	mux.HandleFunc("POST /admin/queues/{queue}/resume", c.pageQueueResume)
	mux.HandleFunc("POST /admin/queues/{queue}/fairness", c.pageQueueFairness)
	mux.HandleFunc("POST /admin/queues/{queue}/group-weights", c.pageQueueGroupWeight)
	// Whatever no page takes (another method, another path) gets the
	// mounting server's own answer, as if the console were not there.
	mux.Handle("/", notFound)
	c.mux = mux
	return c
}

// ServeHTTP serves the pages. The request keeps its path (mount the
// console at /admin and /admin/ without stripping the prefix), and
// r.Pattern is left as the page's route, so that a server naming its spans
// by route names them by page.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mux.ServeHTTP(w, r)
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
	// Live adds the live-refresh switch and its script (runs and queues
	// pages).
	Live bool
	// Done confirms an action that was carried out.
	Done string

	// One of these for the runs and queues pages.
	Runs      *runsView
	Run       *runView
	QueueList *queuesView
	Queue     *queueView

	// The admission page only (admission.go).
	Saved            bool
	View             api.AdmissionView
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

// render writes one page with headers that keep it out of caches and
// frames and allow only its own inline style and script (by nonce).
func (c *Console) render(w http.ResponseWriter, status int, page string, d pageData) {
	d.Nonce = randomToken()
	d.SessionTTL = c.ttl.String()
	var buf bytes.Buffer
	if err := templates[page].ExecuteTemplate(&buf, "layout", d); err != nil {
		c.log.Error("console: render", "page", page, "err", err)
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

func (c *Console) setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: value, Path: "/admin", MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: c.secureCookies(r),
	})
}

// secureCookies says whether the page's cookies get the Secure flag: when
// the server terminates TLS itself, when a proxy in front says it did
// (X-Forwarded-Proto: https; a forged header can only make the cookie
// stricter), or always with Options.AlwaysSecure.
func (c *Console) secureCookies(r *http.Request) bool {
	return c.secure || r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// FormTooLarge is the console's answer (413) to a body larger than its
// forms take. The gateway's body cap sends it before the body is read.
func (c *Console) FormTooLarge(w http.ResponseWriter) {
	c.render(w, http.StatusRequestEntityTooLarge, "refused", pageData{Title: "Request too large",
		Error: fmt.Sprintf("The request is larger than the console's forms take (%d bytes).", MaxFormBytes)})
}

// UnsupportedForm is the console's answer (415) to a body of mediaType,
// such as a multipart form: the forms are urlencoded, and a multipart
// parser would spill to disk.
func (c *Console) UnsupportedForm(w http.ResponseWriter, mediaType string) {
	c.render(w, http.StatusUnsupportedMediaType, "refused", pageData{Title: "Unsupported form",
		Error: "The console takes urlencoded forms only, not " + mediaType + "."})
}

// parseForm reads a small urlencoded form. The body is already capped at
// MaxFormBytes (see MaxFormBytes), so this reads no more than that
// whatever the client sends; past it the answer is 413.
func (c *Console) parseForm(w http.ResponseWriter, r *http.Request) bool {
	if err := r.ParseForm(); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			c.FormTooLarge(w)
			return false
		}
		http.Error(w, "bad form", http.StatusBadRequest)
		return false
	}
	return true
}

// role is what a session may see, worked out from the principal on every
// request so that a token's privileges apply as they are now.
type role int

const (
	roleNone role = iota
	roleTenant
	roleOperator
)

// roleOf classifies a principal. The tokens file forbids config:* on a
// tenant-bound token; the tenant check is repeated so that a tenant can
// never reach the operator's view even if that rule changed.
func roleOf(p auth.Principal) role {
	switch {
	case p.Tenant == "" && p.Has(auth.ConfigRead):
		return roleOperator
	case p.Tenant != "" && p.Has(auth.RunsRead):
		return roleTenant
	}
	return roleNone
}

// sessionGET returns the session of a GET of a runs or queues page and
// its role. A browser without a session goes to the sign-in page; a
// session whose token may no longer use the console is ended with the 403
// page.
func (c *Console) sessionGET(w http.ResponseWriter, r *http.Request) (*session, auth.Principal, role, bool) {
	sess, p, ok := c.current(r)
	if !ok {
		if _, err := r.Cookie(sessionCookie); err == nil {
			c.setCookie(w, r, sessionCookie, "", -1)
		}
		http.Redirect(w, r, "/admin", http.StatusSeeOther)
		return nil, auth.Principal{}, roleNone, false
	}
	rl, ok := c.sessionRole(w, r, sess, p)
	return sess, p, rl, ok
}

// sessionPOST is sessionGET for a form: session and CSRF checked first.
func (c *Console) sessionPOST(w http.ResponseWriter, r *http.Request) (*session, auth.Principal, role, bool) {
	sess, p, ok := c.postSession(w, r)
	if !ok {
		return nil, auth.Principal{}, roleNone, false
	}
	rl, ok := c.sessionRole(w, r, sess, p)
	return sess, p, rl, ok
}

// sessionRole is the role of a session's token; a token that may no longer
// use the console ends the session with the 403 page.
func (c *Console) sessionRole(w http.ResponseWriter, r *http.Request, sess *session, p auth.Principal) (role, bool) {
	rl := roleOf(p)
	if rl == roleNone {
		c.sessions.remove(sess.id)
		c.setCookie(w, r, sessionCookie, "", -1)
		c.refused(w, fmt.Sprintf("Token %q may not use the console: it needs config:read, or a tenant and runs:read.", p.Name))
		return roleNone, false
	}
	return rl, true
}

// base is the page data every signed-in page starts from.
func base(title string, sess *session, p auth.Principal, rl role) pageData {
	return pageData{Title: title, SignedIn: true, Actor: p.Name, Tenant: p.Tenant, Operator: rl == roleOperator, CSRF: sess.csrf}
}

// refused shows the 403 page outside a session: nothing of the
// configuration.
func (c *Console) refused(w http.ResponseWriter, msg string) {
	c.render(w, http.StatusForbidden, "refused", pageData{Title: "Access refused", Error: msg})
}

// forbidden is the 403 page inside a session: the navigation stays, so the
// user can go back to what it may see, and nothing else is shown.
func (c *Console) forbidden(w http.ResponseWriter, sess *session, p auth.Principal, rl role, msg string) {
	d := base("Access refused", sess, p, rl)
	d.Error = msg
	c.render(w, http.StatusForbidden, "refused", d)
}

// refuseAction records a refused action in the audit log and answers with
// the 403 page.
func (c *Console) refuseAction(w http.ResponseWriter, r *http.Request, sess *session, p auth.Principal, rl role, action, queue string, attempted any, msg string) {
	body, _ := json.Marshal(attempted)
	c.auditRefused(r, weights.RefusedChange{Actor: p.Name, Action: action, Queue: queue, Attempted: body, Message: msg,
		Status: http.StatusForbidden})
	c.forbidden(w, sess, p, rl, msg+".")
}

// auditRefused writes a refusal's audit row on shard 0 through the one
// writer of refusals, which folds repeats (weights.AuditRefused), as the
// API's refusals are written.
func (c *Console) auditRefused(r *http.Request, ref weights.RefusedChange) {
	if err := weights.AuditRefused(r.Context(), c.shards[0], ref, weights.DefaultRefusalFold); err != nil {
		c.log.Warn("console: cannot audit a refused change", "actor", ref.Actor, "action", ref.Action, "err", err)
	}
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

func fmtG(f float64) string { return fmt.Sprintf("%.4g", f) }
