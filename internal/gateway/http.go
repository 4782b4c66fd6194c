package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/console"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/telemetry"
	"github.com/harvest-run/harvest/pkg/api"
)

// Handler returns the HTTP API:
//
//	POST /v1/runs               start one run            runs:start
//	POST /v1/runs/batch         start many runs          runs:start
//	GET  /v1/runs               list the tenant's runs   runs:read
//	GET  /v1/runs/{id}          read a run (?wait=30s)   runs:read
//	POST /v1/runs/{id}/cancel   cancel a run             runs:start
//	POST /v1/runs/{id}/retry    retry a failed run       runs:start
//	GET  /v1/usage              own count and limit      runs:read
//	...  /v1/queues/..., /v1/audit, /v1/admission        see adminRoutes
//	...  /admin, /admin/...     the console              browser session (internal/console)
//	GET  /healthz, /readyz      liveness, readiness      none
//	GET  /metrics               metrics (when set)       none
func (g *Gateway) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/runs", g.authed(auth.RunsStart, g.httpStart))
	mux.HandleFunc("POST /v1/runs/batch", g.authed(auth.RunsStart, g.httpStartBatch))
	mux.HandleFunc("GET /v1/runs", g.authed(auth.RunsRead, g.httpList))
	mux.HandleFunc("GET /v1/runs/{id}", g.authed(auth.RunsRead, g.httpGet))
	mux.HandleFunc("POST /v1/runs/{id}/cancel", g.authed(auth.RunsStart, g.httpCancel))
	mux.HandleFunc("POST /v1/runs/{id}/retry", g.audited("run.retry", "", g.authed(auth.RunsStart, g.httpRetry)))
	g.adminRoutes(mux)
	// The console's pages keep their paths (internal/console routes the
	// rest of /admin itself, and answers what it does not serve with
	// noRoute, as this mux would).
	mux.Handle("/admin", g.console)
	mux.Handle("/admin/", g.console)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", g.httpReady)
	if g.metrics != nil {
		mux.Handle("GET /metrics", g.metrics)
	}
	mux.HandleFunc("/", noRoute)
	// Every route's body is capped before any handler sees it, and a
	// connection whose body was left unread is closed after the answer
	// rather than drained.
	return closeOnUnreadBody(g.limitBodies(mux))
}

// noRoute is the answer to a request no route takes.
func noRoute(w http.ResponseWriter, r *http.Request) {
	writeError(w, api.NewError(api.CodeNotFound, "no route for %s %s", r.Method, r.URL.Path))
}

// Server returns the HTTP server of the gateway's Handler with the
// gateway's timeouts. Every one is set: a client that sends its headers or
// its body slowly, or reads its answer slowly, or keeps an idle connection,
// loses the connection instead of holding one of the gateway's file
// descriptors for as long as it likes. A long poll (GET /v1/runs/{id}?wait=)
// gets its wait on top of the write timeout.
//
// The server traces and measures its requests (OpenTelemetry HTTP server
// spans and http.server.request.duration) through TracedHandler.
func (g *Gateway) Server() *http.Server {
	return &http.Server{
		Handler:           TracedHandler(g.Handler()),
		ReadHeaderTimeout: g.cfg.ReadHeaderTimeout,
		ReadTimeout:       g.cfg.ReadTimeout,
		WriteTimeout:      g.cfg.WriteTimeout,
		IdleTimeout:       g.cfg.IdleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
	}
}

// untraced are the paths whose requests make no span: scrapes and probes
// come every few seconds and tell nothing about the runs.
var untraced = map[string]bool{"/metrics": true, "/healthz": true, "/readyz": true}

// TracedHandler wraps h, a handler that routes with an http.ServeMux (such
// as Handler), in an OpenTelemetry HTTP server span per request, named by
// the method and the matched route ("POST /v1/runs", never the path with
// its run id), with the http.route attribute, and records the request
// metrics of the HTTP semantic conventions. A caller's traceparent is
// continued. /metrics, /healthz and /readyz are not traced.
func TracedHandler(h http.Handler) http.Handler {
	withRoute := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		// The mux fills in r.Pattern while routing; otelhttp names the
		// span from it afterwards but sets no http.route on the span.
		if route := routeOf(r.Pattern); route != "" {
			trace.SpanFromContext(r.Context()).SetAttributes(semconv.HTTPRoute(route))
		}
	})
	return otelhttp.NewHandler(withRoute, "http.server",
		otelhttp.WithPropagators(telemetry.Propagator),
		otelhttp.WithFilter(func(r *http.Request) bool { return !untraced[r.URL.Path] }),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			if route := routeOf(r.Pattern); route != "" {
				return r.Method + " " + route
			}
			// Before routing (the span's start) and for requests no
			// route matched, the method alone keeps names bounded.
			return r.Method
		}))
}

// routeOf is the path part of a ServeMux pattern ("GET /v1/runs/{id}"
// gives "/v1/runs/{id}").
func routeOf(pattern string) string {
	if i := strings.IndexByte(pattern, '/'); i >= 0 {
		return pattern[i:]
	}
	return ""
}

// limitBodies caps the body of every request at its route's limit before
// any handler runs, so that no handler, whatever it calls (ParseForm,
// FormValue, io.ReadAll, a JSON decoder), reads more than that:
//
//   - /v1 routes: HARVEST_GATEWAY_MAX_BODY_BYTES. Their handlers check the
//     token before they read, and answer 413 with the API's error body
//     (readBody) for a declared length past the cap without reading, or
//     once the cap is reached.
//   - every other route (the console's pages and forms, sign-in included,
//     and the probes): console.MaxFormBytes. A declared length past it
//     gets the console's 413 page at once, and a multipart body 415: the
//     console's forms are urlencoded, and a multipart parser would spill
//     to disk.
//
// Reading past the cap fails with *http.MaxBytesError; nothing beyond it
// is read from the connection.
func (g *Gateway) limitBodies(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		limit := g.cfg.MaxBodyBytes
		if !strings.HasPrefix(r.URL.Path, "/v1/") {
			limit = console.MaxFormBytes
			if r.ContentLength > limit {
				g.console.FormTooLarge(w)
				return
			}
			if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); strings.HasPrefix(strings.ToLower(mt), "multipart/") {
				g.console.UnsupportedForm(w, mt)
				return
			}
		}
		r.Body = http.MaxBytesReader(w, r.Body, limit)
		h.ServeHTTP(w, r)
	})
}

// closeOnUnreadBody answers a request whose body was not read to its end
// (a refusal given before the body was read: 401, 403, 413...; or a route
// that had no use for it) with Connection: close, and ends the
// connection's reads there. Otherwise the standard library, to keep the
// connection alive, reads up to 256 KB more of the body: before it sends
// the answer (so a client that trickles its body would never get its 401),
// and, for a chunked body, again after the handler even when the
// connection closes next. The gateway would read what it refused.
func closeOnUnreadBody(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength == 0 || r.Body == nil || r.Body == http.NoBody {
			h.ServeHTTP(w, r)
			return
		}
		body := &eofReader{ReadCloser: r.Body}
		r.Body = body
		h.ServeHTTP(&refusalWriter{ResponseWriter: w, body: body}, r)
	})
}

// eofReader notes whether its reader reached the end.
type eofReader struct {
	io.ReadCloser
	eof bool
}

func (e *eofReader) Read(p []byte) (int, error) {
	n, err := e.ReadCloser.Read(p)
	if err == io.EOF {
		e.eof = true
	}
	return n, err
}

// refusalWriter sets Connection: close on an answer written while the
// body is unread.
type refusalWriter struct {
	http.ResponseWriter
	body  *eofReader
	wrote bool
}

func (w *refusalWriter) WriteHeader(status int) {
	if !w.wrote && status >= 200 {
		w.wrote = true
		if !w.body.eof {
			w.Header().Set("Connection", "close")
			// A read deadline already past makes the server's own drain
			// of the body fail at once: what is left stays unread, and
			// the connection closes after the answer.
			_ = http.NewResponseController(w.ResponseWriter).SetReadDeadline(time.Unix(1, 0))
		}
	}
	w.ResponseWriter.WriteHeader(status)
}

// Write sends the header through WriteHeader first, as the standard
// library would, so that an answer without an explicit status is covered.
func (w *refusalWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's deadlines.
func (w *refusalWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// maxHeaderBytes bounds a request's header block: a bearer token and a
// trace context need a few hundred bytes, not the standard library's 1 MB.
const maxHeaderBytes = 64 << 10

type principalHandler func(w http.ResponseWriter, r *http.Request, p auth.Principal)

// authed checks the bearer token (401) and the privilege (403), and that
// the token acts for a tenant: runs belong to tenants, and administrator
// tokens belong to none.
func (g *Gateway) authed(priv auth.Privilege, h principalHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		secret, ok := auth.BearerToken(r.Header.Get("Authorization"))
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="harvest"`)
			writeError(w, api.NewError(api.CodeUnauthenticated, "missing bearer token: send Authorization: Bearer <token>"))
			return
		}
		p, err := g.tokens.Authenticate(secret)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="harvest", error="invalid_token"`)
			writeError(w, api.NewError(api.CodeUnauthenticated, "unknown bearer token"))
			return
		}
		if !p.Has(priv) {
			writeError(w, api.NewError(api.CodePermissionDenied, "token %q lacks the %s privilege", p.Name, priv))
			return
		}
		if p.Tenant == "" {
			writeError(w, api.NewError(api.CodePermissionDenied, "token %q belongs to no tenant; runs are started and read with a tenant's token", p.Name))
			return
		}
		h(w, r, p)
	}
}

// readBody reads a request body up to the configured limit (413 above).
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *api.Error) {
	if r.ContentLength > g.cfg.MaxBodyBytes {
		return nil, tooLarge(g.cfg.MaxBodyBytes)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, g.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge(g.cfg.MaxBodyBytes)
		}
		return nil, api.NewError(api.CodeInvalidArgument, "cannot read the body: %v", err)
	}
	return body, nil
}

func tooLarge(limit int64) *api.Error {
	return api.NewError(api.CodePayloadTooLarge, "the body is larger than the limit of %d bytes", limit)
}

func httpCaller(p auth.Principal) caller {
	return caller{transport: TransportHTTP, tenant: p.Tenant, principal: p.Name}
}

// httpContext continues the caller's trace when the request carries one.
// Under TracedHandler the request's context already holds the HTTP server
// span (a child of the caller's), which the start spans must hang below.
func httpContext(r *http.Request) context.Context {
	if trace.SpanContextFromContext(r.Context()).IsValid() {
		return r.Context()
	}
	return telemetry.Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
}

func (g *Gateway) httpStart(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	body, e := g.readBody(w, r)
	var req api.StartRequest
	if e == nil {
		req, e = decodeStart(body)
	}
	if e != nil {
		g.countRefused(r.Context(), TransportHTTP, e)
		writeError(w, e)
		return
	}
	// The body is read before the start asks for room: a refusal then
	// keeps the connection open, where an unread body would close it and
	// send the refused caller through a new connection on its retry.
	release, e := g.admitStarts(r.Context(), httpCaller(p), 1)
	if e != nil {
		writeError(w, e)
		return
	}
	res := g.startMany(httpContext(r), httpCaller(p), []api.StartRequest{req}, nil)[0]
	release()
	if res.err != nil {
		writeError(w, g.withRetryAfter(res.err))
		return
	}
	w.Header().Set("Location", "/v1/runs/"+url.PathEscape(res.run.ID))
	status := http.StatusOK
	if res.created {
		status = http.StatusCreated
	}
	writeJSON(w, status, res.run)
}

func (g *Gateway) httpStartBatch(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	body, e := g.readBody(w, r)
	if e != nil {
		writeError(w, e)
		return
	}
	reqs, errs, e := decodeBatch(body)
	if e != nil {
		writeError(w, e)
		return
	}
	release, e := g.admitStarts(r.Context(), httpCaller(p), batchWeight(errs, len(reqs)))
	if e != nil {
		writeError(w, e)
		return
	}
	res := g.startMany(httpContext(r), httpCaller(p), reqs, errs)
	release()
	status, resp := batchResponse(res)
	if eb, ok := resp.(api.ErrorBody); ok {
		writeError(w, g.withRetryAfter(eb.Error))
		return
	}
	writeJSON(w, status, resp)
}

// batchWeight is how much of the shard's budget a batch takes: its items
// that passed decoding.
func batchWeight(errs []*api.Error, n int) int {
	w := 0
	for i := range n {
		if errs == nil || errs[i] == nil {
			w++
		}
	}
	return w
}

// batchResponse builds a batch's answer: 200 with every item's result, or
// 503 when the shard could take none of them.
func batchResponse(res []started) (int, any) {
	out := api.BatchStartResponse{Results: make([]api.BatchResult, len(res))}
	unavailable := len(res) > 0
	for i, s := range res {
		if s.err != nil {
			out.Results[i].Error = s.err
			unavailable = unavailable && s.err.Code == api.CodeUnavailable
			continue
		}
		run := s.run
		out.Results[i].Run = &run
		unavailable = false
	}
	if unavailable {
		return http.StatusServiceUnavailable, api.ErrorBody{Error: res[0].err}
	}
	return http.StatusOK, out
}

func (g *Gateway) httpGet(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	id := r.PathValue("id")
	var wait time.Duration
	if s := r.URL.Query().Get("wait"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			writeError(w, api.Invalid("wait", "wait must be a duration such as 30s, got %q", s))
			return
		}
		wait = min(d, g.cfg.MaxWait)
	}
	if wait > 0 {
		// A long poll may outlast the server's write timeout by its own
		// wait, and by no more.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + g.cfg.WriteTimeout))
	}
	run, e := g.getRun(r.Context(), p.Tenant, id, wait)
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, run)
}

func (g *Gateway) httpList(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	q := r.URL.Query()
	for k := range q {
		switch k {
		case "status", "queue", "name", "limit", "cursor":
		default:
			writeError(w, api.Invalid(k, "unknown query parameter %q (known: status, queue, name, limit, cursor)", k))
			return
		}
	}
	lp := runstore.ListParams{Tenant: p.Tenant, Queue: q.Get("queue"), Name: q.Get("name"), Cursor: q.Get("cursor")}
	for _, v := range q["status"] {
		for s := range strings.SplitSeq(v, ",") {
			st, err := api.ParseStatus(strings.TrimSpace(s))
			if err != nil {
				writeError(w, api.Invalid("status", "%v", err))
				return
			}
			// Each status once: a query repeating one a million times
			// would otherwise become a parameter array as long.
			if !slices.Contains(lp.Statuses, st) {
				lp.Statuses = append(lp.Statuses, st)
			}
		}
	}
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > runstore.MaxListLimit {
			writeError(w, api.Invalid("limit", "limit must be an integer from 1 to %d, got %q", runstore.MaxListLimit, s))
			return
		}
		lp.Limit = n
	}
	if lp.Cursor != "" {
		if _, err := runstore.DecodeCursor(lp.Cursor); err != nil {
			writeError(w, g.apiError(err, 0, "list"))
			return
		}
	}
	list, e := g.listRuns(r.Context(), lp)
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

func (g *Gateway) httpCancel(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	run, e := g.cancelRun(r.Context(), p.Tenant, r.PathValue("id"), "cancelled by "+p.Name)
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, run)
}

// httpReady answers 200 when every shard answers a ping (and NATS is
// connected, when used), else 503 naming what is down. The pings go
// through the probe pools and are kept for a moment (readiness, shed.go),
// so the answer does not wait behind the starts.
func (g *Gateway) httpReady(w http.ResponseWriter, r *http.Request) {
	type shardState struct {
		Shard int    `json:"shard"`
		OK    bool   `json:"ok"`
		Error string `json:"error,omitempty"`
	}
	out := struct {
		Ready  bool         `json:"ready"`
		NATS   string       `json:"nats,omitempty"`
		Shards []shardState `json:"shards"`
	}{Ready: true}
	for i, ok := range g.ready.check(r.Context(), len(g.probePools)) {
		st := shardState{Shard: i, OK: true}
		if !ok {
			st.OK, st.Error, out.Ready = false, "unreachable", false
		}
		out.Shards = append(out.Shards, st)
	}
	if g.nc != nil {
		out.NATS = g.nc.Status().String()
		if !g.nc.IsConnected() {
			out.Ready = false
		}
	}
	status := http.StatusOK
	if !out.Ready {
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, out)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(api.ErrorBody{Error: api.NewError(api.CodeInternal, "cannot encode the answer")})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, e *api.Error) {
	// A route that audits its refusals (audited) keeps the error as it is,
	// rather than reading it back from the body.
	if rec, ok := w.(*refusalRecorder); ok {
		rec.err = e
	}
	if (e.Code == api.CodeOverLimit || e.Code == api.CodeUnavailable) && e.RetryAfterMS > 0 {
		w.Header().Set("Retry-After", strconv.FormatInt(e.RetryAfterSeconds(), 10))
	}
	writeJSON(w, e.Status, api.ErrorBody{Error: e})
}
