package gateway

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/console"
	"github.com/harvest-run/harvest/internal/directory"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/tenantcap"
	"github.com/harvest-run/harvest/pkg/weights"
)

// The console (internal/console) is mounted at /admin by Handler, behind
// the same body cap as every route (limitBodies). Its pages ask the
// gateway for what needs the gateway's state through consoleBackend, whose
// methods call the paths the API's handlers call, so that a change made in
// a browser is checked, audited and announced as one made with a token.

// newConsole makes the gateway's console; now is the sessions' clock (nil:
// time.Now).
func newConsole(g *Gateway, now func() time.Time) *console.Console {
	return console.New(console.Options{
		Backend:          consoleBackend{g},
		Shards:           g.shards,
		SessionTTL:       g.cfg.AdminSession,
		SessionsPerToken: g.cfg.AdminSessionsPerToken,
		SignInsPerMinute: g.cfg.AdminSignInsPerMinute,
		AlwaysSecure:     g.cfg.CookieSecure == CookieSecureAlways,
		TraceLink:        g.cfg.TraceLink,
		NotFound:         http.HandlerFunc(noRoute),
		Now:              now,
		Log:              g.log,
	})
}

// consoleBackend is the gateway's side of the console (console.Backend).
type consoleBackend struct{ g *Gateway }

var _ console.Backend = consoleBackend{}

func (b consoleBackend) Authenticate(secret string) (auth.Principal, error) {
	return b.g.tokens.Authenticate(secret)
}

func (b consoleBackend) Admission(ctx context.Context) (api.AdmissionView, *api.Error) {
	view, e := b.g.admissionView(ctx)
	if e != nil {
		// The configuration in force on this gateway, without counts.
		cur := b.g.adm.watcher.Current()
		view = api.AdmissionView{Algorithm: cur.Algorithm, TFM: cur.TFM, MaxRuns: b.g.adm.adm.MaxRuns(), MaxRunsReadOnly: true}
	}
	return view, e
}

func (b consoleBackend) PutAdmission(ctx context.Context, actor string, body []byte) *api.Error {
	_, e := b.g.putAdmission(ctx, actor, body)
	return e
}

func (b consoleBackend) SetCeiling(ctx context.Context, actor, tenant string, maxPriority *int) *api.Error {
	var (
		c   api.PriorityCeiling
		err error
	)
	if maxPriority == nil {
		c, err = tenantcap.ClearCeiling(ctx, b.g.shards[0], actor, tenant)
	} else {
		c, err = tenantcap.SetCeiling(ctx, b.g.shards[0], actor, tenant, *maxPriority)
	}
	if err != nil {
		return b.g.apiError(err, 0, "priority ceiling")
	}
	b.g.ceilingChanged(ctx, c)
	return nil
}

// EnterRunList counts a tenant session's run listing against the tenant's
// bound of listings in flight (listBound), as an API listing is counted.
func (b consoleBackend) EnterRunList(ctx context.Context, tenant string) (func(), *api.Error) {
	if e := b.g.lists.enter(ctx, tenant); e != nil {
		return nil, e
	}
	return func() { b.g.lists.leave(tenant) }, nil
}

// KnownTenant asks the cache first, then shard 0, without placing the
// tenant: a look at (or an action on) a mistyped tenant must not add it to
// the directory, as asking for its home would.
func (b consoleBackend) KnownTenant(ctx context.Context, tenant string) bool {
	if _, cached := b.g.dir.Cached(tenant); cached {
		return true
	}
	_, err := directory.Get(ctx, b.g.shards[0], tenant)
	return !errors.Is(err, directory.ErrNoEntry)
}

func (b consoleBackend) InspectRun(ctx context.Context, tenant, id string) (console.RunDetail, int, error) {
	var detail console.RunDetail
	_, shard, err := b.g.readMoving(ctx, tenant, func(ctx context.Context, shard int) (api.Run, error) {
		var err error
		detail, err = console.Inspect(ctx, b.g.shards[shard], shard, tenant, id)
		return detail.Run, err
	})
	if err == nil || errors.Is(err, runstore.ErrNotFound) {
		return detail, shard, err
	}
	if e := b.g.apiError(err, shard, "inspect run"); e.Code != api.CodeInternal {
		return detail, shard, e
	}
	// apiError logged it; the page tells the operator what failed.
	return detail, shard, err
}

func (b consoleBackend) CancelRun(ctx context.Context, tenant, id, reason string) *api.Error {
	_, e := b.g.cancelRun(ctx, tenant, id, reason)
	return e
}

func (b consoleBackend) RetryRun(ctx context.Context, actor, tenant, id string) *api.Error {
	_, e := b.g.retryRun(ctx, actor, tenant, id)
	return e
}

func (b consoleBackend) PauseQueue(ctx context.Context, actor, queue string, paused bool) (api.QueuePauseResult, *api.Error) {
	return b.g.setQueuePaused(ctx, actor, queue, paused)
}

func (b consoleBackend) SetFairness(ctx context.Context, actor, queue string, req api.QueueFairnessRequest) (api.QueueFairnessResult, error) {
	return weights.SetFairness(ctx, b.g.weightShards(), actor, queue, req, b.g.weightOpts()...)
}

func (b consoleBackend) SetGroupWeight(ctx context.Context, actor, queue, group string, weight *float64) (api.GroupWeightResult, error) {
	return weights.SetGroupWeight(ctx, b.g.weightShards(), actor, queue, group, weight, b.g.weightOpts()...)
}

func (b consoleBackend) Audit(ctx context.Context, limit int) ([]console.AuditEntry, []int, *api.Error) {
	page, e := b.g.auditPage(ctx, "", limit, -1)
	if e != nil {
		return nil, nil, e
	}
	out := make([]console.AuditEntry, len(page.Entries))
	for i, a := range page.Entries {
		out[i] = console.AuditEntry(a)
	}
	return out, page.UnavailableShards, nil
}
