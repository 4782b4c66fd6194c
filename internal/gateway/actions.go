package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/telemetry"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/weights"
)

// retryRun puts a failed or cancelled run of tenant back in its queue (see
// runstore.Retry), audited under actor. It answers 409 for a run in any
// other status, 404 for an unknown id, 429 when admission refuses the
// run, 503 while the tenant moves and the run is not on its new home yet.
//
// A retry adds an unfinished run to the tenant, so it follows a start's
// rules: it goes to the tenant's home, is judged by the same admitter, and
// a shard the tenant moved away from refuses it (the fence); during a move
// the gateway waits for the copy, as a cancel does.
func (g *Gateway) retryRun(ctx context.Context, actor, tenant, id string) (api.Run, *api.Error) {
	var res runstore.RetryResult
	retry := func(ctx context.Context, shard int) (api.Run, error) {
		var err error
		res, err = runstore.Retry(ctx, g.shards[shard], runstore.RetryParams{
			Tenant: tenant, ID: id, Shard: shard, Actor: actor,
			TraceContext: telemetry.InjectJSON(ctx), Admitter: g.admitter,
		})
		return res.Run, err
	}
	shard, err := g.whileMoving(ctx, tenant, retry)
	if errors.Is(err, runstore.ErrNotRetryable) {
		return api.Run{}, notRetryable(res.Run)
	}
	if err != nil {
		return api.Run{}, g.movingAPIError(err, tenant, shard, "retry run")
	}
	if g.nc != nil {
		// A lost wake-up costs the workers' poll interval, never the task.
		if err := dispatch.Publish(ctx, g.nc, g.subjects.Wake(shard, res.Run.Queue), dispatch.Wake{Tasks: 1}); err != nil {
			g.log.Warn("gateway: publish wake-up after a retry", "err", err)
		}
	}
	g.publishRun(ctx, res.Run)
	return res.Run, nil
}

// notRetryable is the 409 of a retry of a run that is neither failed nor
// cancelled, or never started; runstore returns the run with the error.
func notRetryable(run api.Run) *api.Error {
	if run.Status == api.StatusCancelled {
		return api.NewError(api.CodeConflict, "run %s was cancelled before it ever started (a deferred start that never fired): start it again instead", run.ID)
	}
	return api.NewError(api.CodeConflict, "run %s is %s: only a failed or cancelled run can be retried", run.ID, run.Status)
}

// setQueuePaused pauses (paused true) or resumes a queue on every shard,
// audited under actor (weights.Pause).
func (g *Gateway) setQueuePaused(ctx context.Context, actor, queue string, paused bool) (api.QueuePauseResult, *api.Error) {
	res, err := weights.Pause(ctx, g.weightShards(), actor, queue, paused, g.weightOpts()...)
	if err != nil {
		what := "resume queue"
		if paused {
			what = "pause queue"
		}
		return api.QueuePauseResult{}, g.apiError(err, 0, what)
	}
	return res, nil
}

func (g *Gateway) httpRetry(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if !knownQuery(w, r) {
		return
	}
	run, e := g.retryRun(r.Context(), p.Name, p.Tenant, r.PathValue("id"))
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, run)
}

// httpPause is POST /v1/queues/{queue}/pause (paused) or /resume.
func (g *Gateway) httpPause(paused bool) principalHandler {
	return func(w http.ResponseWriter, r *http.Request, p auth.Principal) {
		if !knownQuery(w, r) {
			return
		}
		if p.Tenant != "" {
			// A queue is shared by every tenant: pausing it is the
			// operators' call, whatever the token's privileges.
			writeError(w, api.NewError(api.CodePermissionDenied, "token %q belongs to tenant %q: a queue serves every tenant, so only an operator's token (no tenant) may pause or resume it", p.Name, p.Tenant))
			return
		}
		res, e := g.setQueuePaused(r.Context(), p.Name, r.PathValue("queue"), paused)
		if e != nil {
			writeError(w, e)
			return
		}
		if n := len(res.UnavailableShards); n > 0 {
			g.log.Warn("gateway: a queue pause did not reach every shard", "queue", res.Queue, "paused", paused,
				"unavailable", fmt.Sprint(res.UnavailableShards))
		}
		writeJSON(w, res.Status(), res)
	}
}
