package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/harvest-run/harvest/internal/deferred"
	"github.com/harvest-run/harvest/internal/directory"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/telemetry"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/fairkeys"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// caller is who a start acts for.
type caller struct {
	transport string
	tenant    string
	principal string // token name over HTTP
}

// started is the outcome of one start.
type started struct {
	run     api.Run
	created bool
	err     *api.Error
}

// prepare checks one start and completes it (key binding, id); nothing is
// written. The returned error names the field at fault.
func (g *Gateway) prepare(ctx context.Context, c caller, req *api.StartRequest) *api.Error {
	if e := req.Validate(); e != nil {
		return e
	}
	// Priority sorts before the fair order: above its ceiling a tenant's
	// runs would take every other tenant's claims (docs/fairness.md).
	if e := tenantcap.CheckPriority(g.adm.watcher.Ceilings(), c.tenant, req.Priority); e != nil {
		return e
	}
	if req.Deferred() {
		// The mode's own rules (throttle.limit, debounce.max_wait, ...),
		// checked here so that a bad deferral is refused before the
		// authorizer sees it; deferred.Accept checks them again.
		if _, e := req.ParseDefer(); e != nil {
			return e
		}
	}
	if e := g.checkAhead(req); e != nil {
		return e
	}
	if g.cfg.KeyBinding {
		if e := g.bindKey(c.tenant, req); e != nil {
			return e
		}
	}
	if req.ID == "" {
		id, err := uuid.NewV7()
		if err != nil {
			return api.NewError(api.CodeInternal, "cannot make a run id: %v", err)
		}
		req.ID = id.String()
	}
	if g.authz != nil {
		err := g.authz.AuthorizeStart(ctx, StartAuthorization{
			Transport: c.transport, Tenant: c.tenant, Principal: c.principal, Request: req,
		})
		if err != nil {
			var ae *api.Error
			if errors.As(err, &ae) {
				return ae
			}
			return api.NewError(api.CodePermissionDenied, "start refused: %v", err)
		}
	}
	return nil
}

// checkAhead refuses a run scheduled further ahead than
// HARVEST_GATEWAY_MAX_SCHEDULE_AHEAD. A run counts against its tenant's
// and the system's limits from its start, due or not, so a start at
// 9999-12-31 would hold a slot for ever; the bound makes every slot come
// back within it.
func (g *Gateway) checkAhead(req *api.StartRequest) *api.Error {
	limit := g.cfg.MaxScheduleAhead
	if limit <= 0 {
		return nil
	}
	switch {
	case req.Delay != nil && time.Duration(*req.Delay) > limit:
		return api.Invalid("delay", "delay %s is longer than %s, the furthest a run may be scheduled ahead (HARVEST_GATEWAY_MAX_SCHEDULE_AHEAD): a run that is not due yet holds an admission slot all the while",
			time.Duration(*req.Delay), limit)
	case req.RunAt != nil && time.Until(req.RunAt.Time) > limit:
		return api.Invalid("run_at", "run_at %s is more than %s ahead, the furthest a run may be scheduled (HARVEST_GATEWAY_MAX_SCHEDULE_AHEAD): a run that is not due yet holds an admission slot all the while",
			req.RunAt.Format(time.RFC3339), limit)
	}
	return nil
}

// bindKey applies key binding (HARVEST_GATEWAY_KEY_BINDING) to a start, so
// that no tenant can file runs under another tenant's key: the bound key
// is <tenant> without a key and <tenant>/k with key k.
//
// An ordinary start binds its fairness key and its quota key. A deferred
// start (throttle,
// debounce, batch) may not set one: the run it fires later takes its quota
// key as its fairness key. Binding is therefore applied to its quota key,
// which then becomes the fired run's (bound) fairness key. Leaving the
// quota key unbound instead would let a tenant name another tenant's bound
// key as its quota key and have its deferred runs scheduled, and weighted,
// as that tenant's. The price is that such runs count against the quota
// configured for the bound key (<tenant>/k), not for k.
func (g *Gateway) bindKey(tenant string, req *api.StartRequest) *api.Error {
	field, key := "fairness_key", req.FairnessKey
	if req.Deferred() {
		field, key = "quota_key", req.QuotaKey
	}
	bound := tenant
	// A deferred start's quota key that could not be a fairness key is not
	// used as one (fairkeys.Resolve): its runs are bound as if it had none.
	if key != nil && (!req.Deferred() || fairkeys.ValidateKey(*key) == nil) {
		bound = fairkeys.Bound(tenant, *key)
	}
	if err := fairkeys.ValidateKey(bound); err != nil {
		return api.Invalid(field, "%s bound to the tenant (%q) %v", field, truncate(bound, 80), err)
	}
	if req.Deferred() {
		req.QuotaKey = &bound
		return nil
	}
	req.FairnessKey = &bound
	// An ordinary start's quota key is bound as well, or another tenant
	// on the shard could name it and fill its concurrency cap or drain its
	// rate. No quota key ("" or absent) stays none.
	if req.QuotaKey != nil && *req.QuotaKey != "" {
		q := fairkeys.Bound(tenant, *req.QuotaKey)
		if err := fairkeys.ValidateQuotaKey(q); err != nil {
			return api.Invalid("quota_key", "quota_key bound to the tenant (%q) %v", truncate(q, 80), err)
		}
		req.QuotaKey = &q
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// startMany runs the starts of one caller (one start, or a batch's items)
// on the tenant's home shard: ordinary starts through the shard's
// committer, deferred starts (throttle, debounce, batch) one by one in
// the caller's order through deferred.Start. Items whose err is already
// set are answered with it and not started. Each start gets its own span,
// a child of ctx's.
//
// The home comes from the directory. A shard that refuses the starts
// because the tenant moved away (runstore.MovedError) has them sent again
// to the home the directory names next.
func (g *Gateway) startMany(ctx context.Context, c caller, reqs []api.StartRequest, errs []*api.Error) []started {
	begin := time.Now()
	out := make([]started, len(reqs))
	spans := make([]trace.Span, len(reqs))
	ctxs := make([]context.Context, len(reqs))
	var todo []int
	for i := range reqs {
		// Internal: the HTTP and NATS servers make the server span this
		// one sits under.
		sctx, span := g.tracer.Start(ctx, "harvest.start", trace.WithSpanKind(trace.SpanKindInternal))
		spans[i], ctxs[i] = span, sctx
		// A span that records nothing (no exporter) still carries the
		// trace onward; its attributes would only be built and dropped.
		recording := span.IsRecording()
		if recording {
			span.SetAttributes(
				attribute.String("harvest.transport", c.transport),
				attribute.String("harvest.tenant", c.tenant))
		}
		if errs != nil && errs[i] != nil {
			out[i].err = errs[i]
			continue
		}
		if e := g.prepare(sctx, c, &reqs[i]); e != nil {
			out[i].err = e
			continue
		}
		if recording {
			span.SetAttributes(
				attribute.String("harvest.run_id", reqs[i].ID),
				attribute.String("harvest.queue", reqs[i].Queue),
				attribute.String("harvest.fairness_key", reqs[i].Key()))
		}
		todo = append(todo, i)
	}
	if len(todo) > 0 {
		e, ae := g.entry(ctx, c.tenant)
		for ae == nil && len(todo) > 0 {
			moved := g.startOn(ctx, c, e, reqs, ctxs, spans, todo, out)
			if len(moved) == 0 {
				break
			}
			next, ok := g.awaitNewHome(ctx, c.tenant, e.Shard)
			if !ok {
				ae = movingError(c.tenant, "its new home is not recorded yet")
			}
			e, todo = next, moved
		}
		if ae != nil {
			for _, i := range todo {
				out[i] = started{err: ae}
			}
		}
	}
	elapsed := time.Since(begin).Seconds()
	for i, span := range spans {
		recording := span.IsRecording()
		outcome := "created"
		switch {
		case out[i].err != nil:
			outcome = string(out[i].err.Code)
			span.SetStatus(codes.Error, out[i].err.Message)
			if recording {
				span.SetAttributes(attribute.Int("http.response.status_code", out[i].err.Status))
			}
		case !out[i].created:
			outcome = "replayed"
		}
		if recording {
			span.SetAttributes(attribute.String("harvest.outcome", outcome))
		}
		span.End()
		attrs := g.outcomeOption(c.transport, outcome)
		g.starts.Add(ctx, 1, attrs)
		g.duration.Record(ctx, elapsed, attrs)
	}
	return out
}

// startOn writes the prepared starts todo (indexes into reqs) on the home
// e names and fills their answers in out. It returns the starts the shard
// refused because the tenant has moved away, which are left unanswered.
//
// During a move (e.From() >= 0) each start's id is first looked up on the
// old home: a start sent again whose run is still there is answered from
// it, never written a second time; the old home takes no new runs (it is
// fenced), so an id not found there cannot appear there later. Deferred
// starts wait for the end of the move (503 with Retry-After): their
// windows and throttle queues are kept on the old home until it ends.
func (g *Gateway) startOn(ctx context.Context, c caller, e directory.Entry, reqs []api.StartRequest,
	ctxs []context.Context, spans []trace.Span, todo []int, out []started) (moved []int) {
	shard := e.Shard
	var params []runstore.StartParams
	var index, deferredIdx []int
	for _, i := range todo {
		if spans[i].IsRecording() {
			spans[i].SetAttributes(attribute.Int("harvest.shard", shard))
		}
		if reqs[i].Deferred() {
			if e.From() >= 0 {
				out[i] = started{err: movingError(c.tenant, "deferred starts are taken again once its runs are copied")}
				continue
			}
			deferredIdx = append(deferredIdx, i)
			continue
		}
		params = append(params, runstore.StartParams{Tenant: c.tenant, Shard: shard, Req: reqs[i], TraceContext: telemetry.InjectJSON(ctxs[i])})
		index = append(index, i)
	}
	if from := e.From(); from >= 0 && len(params) > 0 {
		params, index = g.answerFromOldHome(ctx, from, params, index, out)
	}
	var wg sync.WaitGroup
	var committedMoved []int
	commit := func() {
		results := g.committers[shard].StartMany(ctx, params)
		for j, r := range results {
			i := index[j]
			if r.Err != nil {
				if runstore.AsMoved(r.Err) != nil {
					committedMoved = append(committedMoved, i)
					continue
				}
				out[i].err = g.apiError(r.Err, shard, "start")
				continue
			}
			out[i] = started{run: r.Result.Run, created: r.Result.Created}
		}
	}
	switch {
	case len(params) > 0 && len(deferredIdx) > 0:
		// The deferred starts go one by one meanwhile.
		wg.Go(commit)
	case len(params) > 0:
		commit()
	}
	for _, i := range deferredIdx {
		res, err := g.startDeferred(ctxs[i], c, shard, reqs[i])
		if runstore.AsMoved(err) != nil {
			moved = append(moved, i)
			continue
		}
		out[i] = res
		if out[i].err == nil {
			spans[i].SetAttributes(attribute.String("harvest.defer_mode", string(out[i].run.DeferMode)))
		}
	}
	wg.Wait()
	moved = append(moved, committedMoved...)
	slices.Sort(moved)
	return moved
}

// answerFromOldHome answers, from a moving tenant's old home, the starts
// whose ids it still holds (one read for all of them), and returns the
// others, to be written on the new home.
func (g *Gateway) answerFromOldHome(ctx context.Context, from int, params []runstore.StartParams, index []int,
	out []started) ([]runstore.StartParams, []int) {
	old := make([]runstore.StartParams, len(params))
	for j, p := range params {
		old[j] = p
		old[j].Shard = from
	}
	res, found, err := runstore.Existing(ctx, g.shards[from], old)
	if err != nil {
		e := g.apiError(err, from, "start")
		for _, i := range index {
			out[i] = started{err: e}
		}
		return nil, nil
	}
	var restP []runstore.StartParams
	var restI []int
	for j, i := range index {
		if !found[j] {
			restP, restI = append(restP, params[j]), append(restI, i)
			continue
		}
		out[i] = started{run: res[j].Result.Run}
		if res[j].Err != nil {
			out[i].err = g.apiError(res[j].Err, from, "start")
		}
	}
	return restP, restI
}

// startDeferred takes one deferred start in a transaction of its own on
// the tenant's home shard. Admission is decided there, when the start is
// accepted (see docs/deferred.md), by the same admitter as the committers
// use. Runs the start fired at once (a throttled start under its limit, a
// batch it filled) are announced like those of a committed group.
//
// A tenant that moved away from the shard is returned as the database's
// error, for startOn to send the start to the new home; any other error
// is in the answer.
func (g *Gateway) startDeferred(ctx context.Context, c caller, shard int, req api.StartRequest) (started, error) {
	res, err := deferred.Start(ctx, g.shards[shard], deferred.Params{
		Tenant: c.tenant, Shard: shard, Req: req, TraceContext: telemetry.InjectJSON(ctx), Admitter: g.admitter,
	})
	if runstore.AsMoved(err) != nil {
		return started{}, err
	}
	if err != nil {
		return started{err: g.apiError(err, shard, "deferred start")}, nil
	}
	if len(res.Started) > 0 {
		g.publishStarted(shard, res.Started)
	}
	return started{run: res.Run, created: res.Created}, nil
}

// contextOf rebuilds a context carrying a stored trace context, so the
// messages published for a start continue its trace.
func contextOf(tc json.RawMessage) context.Context {
	sc := telemetry.SpanContextFromJSON(tc)
	if !sc.IsValid() {
		return context.Background()
	}
	return trace.ContextWithRemoteSpanContext(context.Background(), sc)
}

// publishStarted announces a committed group: one wake-up per queue that
// got work now, and a dispatch for each new task whose queue had no
// backlog. Tasks due later are left to the worker's promotion of due rows.
// Publishing never fails a start: errors are logged.
func (g *Gateway) publishStarted(shard int, group []runstore.Committed) {
	if g.nc == nil {
		return
	}
	type wake struct {
		ctx   context.Context
		tasks int
	}
	wakes := map[string]*wake{}
	var order []string
	for _, c := range group {
		req := &c.Params.Req
		if (req.RunAt != nil && req.RunAt.After(c.Result.Run.CreatedAt.Time)) || (req.Delay != nil && *req.Delay > 0) {
			continue
		}
		ctx := contextOf(c.Params.TraceContext)
		w := wakes[req.Queue]
		if w == nil {
			w = &wake{ctx: ctx}
			wakes[req.Queue] = w
			order = append(order, req.Queue)
		}
		w.tasks++
		if !c.Result.QueueBusy {
			err := dispatch.Publish(ctx, g.nc, g.subjects.Dispatch(shard, req.Queue),
				dispatch.Dispatch{TaskID: c.Result.TaskID, Queue: req.Queue})
			if err != nil {
				g.log.Warn("gateway: publish dispatch", "shard", shard, "err", err)
			}
		}
	}
	for _, q := range order {
		w := wakes[q]
		if err := dispatch.Publish(w.ctx, g.nc, g.subjects.Wake(shard, q), dispatch.Wake{Tasks: w.tasks}); err != nil {
			g.log.Warn("gateway: publish wake", "shard", shard, "err", err)
		}
	}
}

// publishRun announces a run that reached a final state at the gateway
// (a cancel) on its run-event subject.
func (g *Gateway) publishRun(ctx context.Context, run api.Run) {
	if g.nc == nil {
		return
	}
	if err := dispatch.Publish(ctx, g.nc, g.subjects.Runs(run.Tenant, run.ID), run); err != nil {
		g.log.Warn("gateway: publish run event", "err", err)
	}
}
