package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"sort"
	"strconv"

	"github.com/harvest-run/harvest/internal/auditdoc"
	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/fairkeys"
	"github.com/harvest-run/harvest/pkg/tenantcap"
	"github.com/harvest-run/harvest/pkg/weights"
)

// adminRoutes adds the operator routes to mux:
//
//	GET    /v1/queues/{queue}/weights              weights:read
//	PUT    /v1/queues/{queue}/weights/{key}        weights:write
//	DELETE /v1/queues/{queue}/weights/{key}        weights:write
//	GET    /v1/queues/{queue}/quotas               weights:read
//	GET    /v1/queues/{queue}/quotas/{quota_key}   weights:read
//	PUT    /v1/queues/{queue}/quotas/{quota_key}   weights:write
//	DELETE /v1/queues/{queue}/quotas/{quota_key}   weights:write
//	GET    /v1/queues/{queue}/keys                 weights:read
//	POST   /v1/queues/{queue}/pause                weights:write
//	POST   /v1/queues/{queue}/resume               weights:write
//	the fairness modes and group weights           (fairnessRoutes)
//	GET    /v1/audit                               config:read
//	GET    /v1/admission                           config:read
//	PUT    /v1/admission                           config:write
//	GET    /v1/usage                               runs:read (a tenant's token)
//	the tenants' priority ceilings                 (tenantRoutes)
//
// Path values arrive URL-decoded, so a queue named "orders.eu" or "my queue"
// is sent as /v1/queues/orders.eu/... or /v1/queues/my%20queue/....
func (g *Gateway) adminRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/queues/{queue}/weights", g.operator(auth.WeightsRead, g.httpGetWeights))
	mux.HandleFunc("PUT /v1/queues/{queue}/weights/{key}", g.audited("weight.set", "key", g.operator(auth.WeightsWrite, g.httpSetWeight)))
	mux.HandleFunc("DELETE /v1/queues/{queue}/weights/{key}", g.audited("weight.clear", "key", g.operator(auth.WeightsWrite, g.httpClearWeight)))
	mux.HandleFunc("GET /v1/queues/{queue}/quotas", g.operator(auth.WeightsRead, g.httpGetQuota))
	mux.HandleFunc("GET /v1/queues/{queue}/quotas/{quota_key}", g.operator(auth.WeightsRead, g.httpGetQuota))
	mux.HandleFunc("PUT /v1/queues/{queue}/quotas/{quota_key}", g.audited("quota.set", "quota_key", g.operator(auth.WeightsWrite, g.httpSetQuota)))
	mux.HandleFunc("DELETE /v1/queues/{queue}/quotas/{quota_key}", g.audited("quota.clear", "quota_key", g.operator(auth.WeightsWrite, g.httpClearQuota)))
	mux.HandleFunc("GET /v1/queues/{queue}/keys", g.operator(auth.WeightsRead, g.httpKeys))
	mux.HandleFunc("POST /v1/queues/{queue}/pause", g.audited(weights.ActionQueuePause, "", g.operator(auth.WeightsWrite, g.httpPause(true))))
	mux.HandleFunc("POST /v1/queues/{queue}/resume", g.audited(weights.ActionQueueResume, "", g.operator(auth.WeightsWrite, g.httpPause(false))))
	mux.HandleFunc("GET /v1/audit", g.operator(auth.ConfigRead, g.httpAudit))
	mux.HandleFunc("GET /v1/admission", g.operator(auth.ConfigRead, g.httpGetAdmission))
	mux.HandleFunc("PUT /v1/admission", g.httpPutAdmission)
	mux.HandleFunc("GET /v1/usage", g.authed(auth.RunsRead, g.httpUsage))
	g.fairnessRoutes(mux)
	g.tenantRoutes(mux)
}

// principal authenticates the bearer token: 401 (with WWW-Authenticate)
// when it is missing or unknown.
func (g *Gateway) principal(w http.ResponseWriter, r *http.Request) (auth.Principal, bool) {
	secret, ok := auth.BearerToken(r.Header.Get("Authorization"))
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="harvest"`)
		writeError(w, api.NewError(api.CodeUnauthenticated, "missing bearer token: send Authorization: Bearer <token>"))
		return auth.Principal{}, false
	}
	p, err := g.tokens.Authenticate(secret)
	if err != nil {
		w.Header().Set("WWW-Authenticate", `Bearer realm="harvest", error="invalid_token"`)
		writeError(w, api.NewError(api.CodeUnauthenticated, "unknown bearer token"))
		return auth.Principal{}, false
	}
	return p, true
}

// operator checks the token (401) and the privilege (403) of a route that
// acts on the whole installation rather than on one tenant's runs, so
// administrator tokens (no tenant) are welcome.
func (g *Gateway) operator(priv auth.Privilege, h principalHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, ok := g.principal(w, r)
		if !ok {
			return
		}
		if !p.Has(priv) {
			writeError(w, api.NewError(api.CodePermissionDenied, "token %q lacks the %s privilege", p.Name, priv))
			return
		}
		h(w, r, p)
	}
}

// weightShards is every shard in the form pkg/weights fans out over.
func (g *Gateway) weightShards() []weights.Shard {
	out := make([]weights.Shard, len(g.shards))
	for i, p := range g.shards {
		out[i] = weights.Shard{Index: i, DB: p}
	}
	return out
}

func (g *Gateway) weightOpts() []weights.Option {
	if g.nc == nil {
		return nil
	}
	return []weights.Option{weights.WithNATS(g.nc, g.subjects)}
}

// audited records the refusals of a write route in the audit log (on
// shard 0), through the one folding writer (weights.AuditRefused): the
// refusals of one token at one action with one status within a minute
// share a row and its count, whatever the caller varies (queue, key,
// query parameter, body), and every text the row keeps is capped. That
// covers a 403, whether for want of the privilege or for another tenant's
// key, a 400 (a bad value, an unknown query parameter), a 413 and a 429.
// An unknown token (401) names no actor and is not recorded; failures of
// the shards (5xx) are not refusals.
func (g *Gateway) audited(action, keyParam string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body bytes.Buffer
		if r.Body != nil {
			r.Body = struct {
				io.Reader
				io.Closer
			}{io.TeeReader(r.Body, &limitedWriter{w: &body, n: auditBodyBytes}), r.Body}
		}
		rec := &refusalRecorder{ResponseWriter: w}
		h(rec, r)
		// 409 is a refusal at the override cap, which the shards' own
		// write functions audit; 401 names no actor; 404 (a retry of an
		// unknown run) changes nothing anyone could ask for; 5xx is no
		// refusal.
		e := rec.err
		if e == nil || e.Status == http.StatusUnauthorized || e.Status == http.StatusConflict ||
			e.Status == http.StatusNotFound || e.Status >= 500 {
			return
		}
		secret, _ := auth.BearerToken(r.Header.Get("Authorization"))
		p, err := g.tokens.Authenticate(secret)
		if err != nil {
			return
		}
		msg := e.Message
		if e.Field != "" {
			msg = auditdoc.Text(e.Field, echoBytes) + ": " + msg
		}
		g.auditRefused(r, weights.RefusedChange{Actor: p.Name, Action: action, Queue: r.PathValue("queue"),
			Key: r.PathValue(keyParam), Attempted: body.Bytes(), Message: msg, Status: e.Status})
	}
}

// echoBytes bounds a name the caller chose (a query parameter, a field)
// where an error message or an audit row repeats it.
const echoBytes = 128

// auditBodyBytes bounds what audited keeps of a request body: one byte
// more than a row stores, so that auditdoc.Value sees a longer body was
// cut and marks it.
const auditBodyBytes = auditdoc.MaxBytes + 1

// auditRefused writes a refusal's audit row on shard 0, folded
// (weights.AuditRefused).
func (g *Gateway) auditRefused(r *http.Request, ref weights.RefusedChange) {
	if err := weights.AuditRefused(r.Context(), g.shards[0], ref, weights.DefaultRefusalFold); err != nil {
		g.log.Warn("gateway: cannot audit a refused change", "actor", ref.Actor, "action", ref.Action, "err", err)
	}
}

// refusalRecorder is the writer of an audited route: writeError leaves
// the refusal it answers with here.
type refusalRecorder struct {
	http.ResponseWriter
	err *api.Error
}

// limitedWriter keeps the first n bytes written to it and drops the rest.
type limitedWriter struct {
	w *bytes.Buffer
	n int
}

func (l *limitedWriter) Write(b []byte) (int, error) {
	if room := l.n - l.w.Len(); room > 0 {
		l.w.Write(b[:min(room, len(b))])
	}
	return len(b), nil
}

// readOpts are the options of a weights read for p: a tenant's token sees
// only the keys bound to its tenant, an operator's every key.
func (g *Gateway) readOpts(p auth.Principal) []weights.Option {
	opts := g.weightOpts()
	if p.Tenant != "" {
		opts = append(opts, weights.WithOwner(p.Tenant))
	}
	return opts
}

// ownKey refuses (403) a tenant's token that writes the weight or quota of
// a key not bound to its tenant; an operator's token may write any key.
func ownKey(w http.ResponseWriter, p auth.Principal, what, key string) bool {
	if p.Tenant == "" || fairkeys.BoundTo(key, p.Tenant) {
		return true
	}
	writeError(w, api.NewError(api.CodePermissionDenied, "token %q of tenant %q may only set the %s of its own keys (%q or %q...), not of %q",
		p.Name, p.Tenant, what, p.Tenant, p.Tenant+"/", key))
	return false
}

// knownQuery refuses query parameters other than names (400 naming it).
func knownQuery(w http.ResponseWriter, r *http.Request, names ...string) bool {
	keys := make([]string, 0, len(r.URL.Query()))
	for k := range r.URL.Query() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		known := false
		for _, n := range names {
			known = known || k == n
		}
		if !known {
			msg := "unknown query parameter %q (this route takes none)"
			if len(names) > 0 {
				msg = "unknown query parameter %q (known: " + joinStrings(names) + ")"
			}
			writeError(w, api.Invalid(k, msg, auditdoc.Text(k, echoBytes)))
			return false
		}
	}
	return true
}

func joinStrings(v []string) string {
	out := ""
	for i, s := range v {
		if i > 0 {
			out += ", "
		}
		out += s
	}
	return out
}

// intQuery reads an optional positive integer query parameter.
func intQuery(r *http.Request, name string, lo, hi int) (int, *api.Error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, api.Invalid(name, "%s must be an integer from %d to %d, got %q", name, lo, hi, s)
	}
	return n, nil
}

// readObject reads a JSON object body and refuses fields that t (a struct)
// does not have, naming the first one in sorted order, so that every
// route's 400 names the field whatever decoder follows.
func (g *Gateway) readObject(w http.ResponseWriter, r *http.Request, t reflect.Type) ([]byte, *api.Error) {
	body, e := g.readBody(w, r)
	if e != nil {
		return nil, e
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(bytes.TrimSpace(body), &obj) == nil && obj != nil {
		fields := jsonFields(t)
		keys := make([]string, 0, len(obj))
		for k := range obj {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if _, ok := fields[k]; !ok {
				return nil, api.Invalid(k, "unknown field %q (known: %s)", k, joinStrings(sortedKeys(fields)))
			}
		}
	}
	return body, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// writeResult writes a pkg/weights result with its own status (200, 207,
// 409, 503) and logs a change event that could not be published.
func (g *Gateway) writeResult(w http.ResponseWriter, status int, v any, publishErr error) {
	if publishErr != nil {
		g.log.Warn("gateway: weights change event not published; workers still read the change at their next claim", "err", publishErr)
	}
	writeJSON(w, status, v)
}

func (g *Gateway) httpGetWeights(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if !knownQuery(w, r) {
		return
	}
	res, err := weights.Get(r.Context(), g.weightShards(), r.PathValue("queue"), g.readOpts(p)...)
	if err != nil {
		writeError(w, g.apiError(err, 0, "get weights"))
		return
	}
	writeJSON(w, res.Status(), res)
}

func (g *Gateway) httpSetWeight(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if !knownQuery(w, r) || !ownKey(w, p, "weight", r.PathValue("key")) {
		return
	}
	body, e := g.readObject(w, r, reflect.TypeFor[api.WeightBody]())
	if e != nil {
		writeError(w, e)
		return
	}
	weight, err := weights.DecodeWeightBody(bytes.NewReader(body))
	if err != nil {
		writeError(w, g.apiError(err, 0, "set weight"))
		return
	}
	res, err := weights.Set(r.Context(), g.weightShards(), p.Name, r.PathValue("queue"), r.PathValue("key"), weight, g.weightOpts()...)
	if err != nil {
		writeError(w, g.apiError(err, 0, "set weight"))
		return
	}
	g.writeResult(w, res.Status(), res, res.PublishErr)
}

func (g *Gateway) httpClearWeight(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if !knownQuery(w, r) || !ownKey(w, p, "weight", r.PathValue("key")) {
		return
	}
	res, err := weights.Clear(r.Context(), g.weightShards(), p.Name, r.PathValue("queue"), r.PathValue("key"), g.weightOpts()...)
	if err != nil {
		writeError(w, g.apiError(err, 0, "clear weight"))
		return
	}
	g.writeResult(w, res.Status(), res, res.PublishErr)
}

func (g *Gateway) httpGetQuota(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if !knownQuery(w, r) {
		return
	}
	res, err := weights.GetQuota(r.Context(), g.weightShards(), r.PathValue("queue"), r.PathValue("quota_key"), g.readOpts(p)...)
	if err != nil {
		writeError(w, g.apiError(err, 0, "get quota"))
		return
	}
	writeJSON(w, res.Status(), res)
}

func (g *Gateway) httpSetQuota(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if !knownQuery(w, r) || !ownKey(w, p, "quota", r.PathValue("quota_key")) {
		return
	}
	body, e := g.readObject(w, r, reflect.TypeFor[api.Quota]())
	if e != nil {
		writeError(w, e)
		return
	}
	q, err := weights.DecodeQuotaBody(bytes.NewReader(body))
	if err != nil {
		writeError(w, g.apiError(err, 0, "set quota"))
		return
	}
	res, err := weights.SetQuota(r.Context(), g.weightShards(), p.Name, r.PathValue("queue"), r.PathValue("quota_key"), q, g.weightOpts()...)
	if err != nil {
		writeError(w, g.apiError(err, 0, "set quota"))
		return
	}
	g.writeResult(w, res.Status(), res, res.PublishErr)
}

func (g *Gateway) httpClearQuota(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if !knownQuery(w, r) || !ownKey(w, p, "quota", r.PathValue("quota_key")) {
		return
	}
	res, err := weights.ClearQuota(r.Context(), g.weightShards(), p.Name, r.PathValue("queue"), r.PathValue("quota_key"), g.weightOpts()...)
	if err != nil {
		writeError(w, g.apiError(err, 0, "clear quota"))
		return
	}
	g.writeResult(w, res.Status(), res, res.PublishErr)
}

func (g *Gateway) httpKeys(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if !knownQuery(w, r, "limit") {
		return
	}
	limit, e := intQuery(r, "limit", 1, weights.MaxKeyLimit)
	if e != nil {
		writeError(w, e)
		return
	}
	if p.Tenant != "" {
		// The view counts the queue's pending tasks on every shard, a read
		// that grows with the backlog: a tenant's calls share its bound of
		// listings in flight (operators' do not).
		if e := g.lists.enter(r.Context(), p.Tenant); e != nil {
			writeError(w, e)
			return
		}
		defer g.lists.leave(p.Tenant)
	}
	res, err := weights.Keys(r.Context(), g.weightShards(), r.PathValue("queue"), limit, g.readOpts(p)...)
	if err != nil {
		writeError(w, g.apiError(err, 0, "keys"))
		return
	}
	if p.Tenant != "" {
		// A tenant learns that the queue is paused and since when, not
		// which operator's token paused it.
		for i := range res.Shards {
			if ps := res.Shards[i].Paused; ps != nil {
				ps.By = ""
			}
		}
	}
	writeJSON(w, res.Status(), res)
}

func (g *Gateway) httpAudit(w http.ResponseWriter, r *http.Request, _ auth.Principal) {
	if !knownQuery(w, r, "limit", "cursor", "shard") {
		return
	}
	limit, e := intQuery(r, "limit", 1, weights.MaxAuditLimit)
	if e != nil {
		writeError(w, e)
		return
	}
	shard := -1
	if s := r.URL.Query().Get("shard"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 || n >= len(g.shards) {
			writeError(w, api.Invalid("shard", "shard must be a shard index from 0 to %d, got %q", len(g.shards)-1, s))
			return
		}
		shard = n
	}
	page, e := g.auditPage(r.Context(), r.URL.Query().Get("cursor"), limit, shard)
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, page)
}

func (g *Gateway) httpGetAdmission(w http.ResponseWriter, r *http.Request, _ auth.Principal) {
	if !knownQuery(w, r) {
		return
	}
	v, e := g.admissionView(r.Context())
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// httpPutAdmission changes the admission configuration. Every refusal of a
// known token (403 without config:write, 413, 400) is written to the audit
// log on shard 0 with the token's name; unknown tokens get 401 unaudited.
func (g *Gateway) httpPutAdmission(w http.ResponseWriter, r *http.Request) {
	p, ok := g.principal(w, r)
	if !ok {
		return
	}
	refuse := func(body []byte, e *api.Error) {
		if err := tenantcap.RecordRefusal(r.Context(), g.shards[0], p.Name, body, e); err != nil {
			g.log.Warn("admission: cannot audit a refused change", "actor", p.Name, "err", err)
		}
		writeError(w, e)
	}
	if !knownQuery(w, r) {
		return
	}
	body, e := g.readBody(w, r)
	if !p.Has(auth.ConfigWrite) {
		// Without the privilege: one row per actor and minute, counted.
		e := api.NewError(api.CodePermissionDenied, "token %q lacks the %s privilege", p.Name, auth.ConfigWrite)
		g.auditRefused(r, weights.RefusedChange{Actor: p.Name, Action: tenantcap.AuditAction, Attempted: body, Message: e.Message,
			Status: e.Status})
		writeError(w, e)
		return
	}
	if e != nil {
		refuse(nil, e)
		return
	}
	// ApplyPut audits its own refusals (400).
	if _, e := g.putAdmission(r.Context(), p.Name, body); e != nil {
		writeError(w, e)
		return
	}
	v, e := g.admissionView(r.Context())
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func (g *Gateway) httpUsage(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if !knownQuery(w, r) {
		return
	}
	e, ae := g.entry(r.Context(), p.Tenant)
	if ae != nil {
		writeError(w, ae)
		return
	}
	u, err := g.adm.adm.Usage(r.Context(), g.shards[e.Shard], e.Shard, p.Tenant, g.adm.watcher.Ceilings())
	if err != nil {
		writeError(w, g.apiError(err, e.Shard, "usage"))
		return
	}
	writeJSON(w, http.StatusOK, u)
}
