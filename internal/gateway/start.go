package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/internal/telemetry"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/fairkeys"
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

// home returns the tenant's home shard.
func (g *Gateway) home(tenant string) int { return shards.Home(tenant, len(g.shards)) }

// prepare checks one start and completes it (key binding, id); nothing is
// written. The returned error names the field at fault.
func (g *Gateway) prepare(ctx context.Context, c caller, req *api.StartRequest) *api.Error {
	if e := req.Validate(); e != nil {
		return e
	}
	if req.Deferred() {
		// Reserved: the start modes that fire later arrive with their own
		// issue. Refuse them rather than start a run now.
		field := "throttle"
		switch {
		case len(req.Debounce) > 0:
			field = "debounce"
		case len(req.Batch) > 0:
			field = "batch"
		}
		return api.Invalid(field, "%s starts are not supported by this gateway yet", field)
	}
	if g.cfg.KeyBinding {
		bound := c.tenant
		if req.FairnessKey != nil {
			bound = c.tenant + "/" + *req.FairnessKey
		}
		if err := fairkeys.ValidateKey(bound); err != nil {
			return api.Invalid("fairness_key", "fairness_key bound to the tenant (%q) %v", truncate(bound, 80), err)
		}
		req.FairnessKey = &bound
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

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// startMany runs the starts of one caller (one start, or a batch's items)
// through the home shard's committer. Items whose err is already set are
// answered with it and not started. Each start gets its own span, a child
// of ctx's.
func (g *Gateway) startMany(ctx context.Context, c caller, reqs []api.StartRequest, errs []*api.Error) []started {
	begin := time.Now()
	shard := g.home(c.tenant)
	out := make([]started, len(reqs))
	spans := make([]trace.Span, len(reqs))
	var params []runstore.StartParams
	var index []int
	for i := range reqs {
		sctx, span := g.tracer.Start(ctx, "harvest.start", trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(
				attribute.String("harvest.transport", c.transport),
				attribute.String("harvest.tenant", c.tenant),
				attribute.Int("harvest.shard", shard)))
		spans[i] = span
		if errs != nil && errs[i] != nil {
			out[i].err = errs[i]
			continue
		}
		if e := g.prepare(sctx, c, &reqs[i]); e != nil {
			out[i].err = e
			continue
		}
		span.SetAttributes(
			attribute.String("harvest.run_id", reqs[i].ID),
			attribute.String("harvest.queue", reqs[i].Queue),
			attribute.String("harvest.fairness_key", reqs[i].Key()))
		params = append(params, runstore.StartParams{
			Tenant: c.tenant, Shard: shard, Req: reqs[i], TraceContext: telemetry.InjectJSON(sctx),
		})
		index = append(index, i)
	}
	if len(params) > 0 {
		results := g.committers[shard].StartMany(ctx, params)
		for j, r := range results {
			i := index[j]
			if r.Err != nil {
				out[i].err = g.apiError(r.Err, shard, "start")
				continue
			}
			out[i] = started{run: r.Result.Run, created: r.Result.Created}
		}
	}
	elapsed := time.Since(begin).Seconds()
	for i, span := range spans {
		outcome := "created"
		switch {
		case out[i].err != nil:
			outcome = string(out[i].err.Code)
			span.SetStatus(codes.Error, out[i].err.Message)
			span.SetAttributes(attribute.Int("http.response.status_code", out[i].err.Status))
		case !out[i].created:
			outcome = "replayed"
		}
		span.SetAttributes(attribute.String("harvest.outcome", outcome))
		span.End()
		attrs := metric.WithAttributes(attribute.String("transport", c.transport), attribute.String("outcome", outcome))
		g.starts.Add(ctx, 1, attrs)
		g.duration.Record(ctx, elapsed, attrs)
	}
	return out
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
