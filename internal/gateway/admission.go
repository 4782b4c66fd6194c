package gateway

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// admission is the gateway's wiring of tenant admission: the cached shard
// totals, the configuration watcher, the capacity leases and the Admitter
// that the committers call inside every start transaction, all of them
// pkg/tenantcap's (which decides; its doc says where each part lives).
type admission struct {
	adm     *tenantcap.Admitter
	watcher *tenantcap.Watcher
	totals  *tenantcap.Totals
	// leases divide max_runs among the shards (docs/admission.md).
	leases *tenantcap.Leases
	// loaded is set once the configuration was read from shard 0; until
	// then new runs are refused with 503 rather than admitted under a
	// configuration the gateway does not know.
	loaded atomic.Bool

	decisions metric.Int64Counter
	// outcomes are the counter's attribute sets, by outcome.
	outcomes map[string]metric.MeasurementOption

	ctx    context.Context // ends with close
	cancel context.CancelFunc
	bg     sync.WaitGroup
	loadMu sync.Mutex // one watcher start at a time
}

// Outcomes of the admission decision counter.
const (
	admitAdmitted      = "admitted"
	admitRefusedTenant = "refused_tenant_limit"
	admitRefusedSystem = "refused_system_limit"
	admitNotLoaded     = "config_not_loaded"
	admitError         = "error"
)

// initAdmission builds the admission parts over the shard pools and starts
// their background work: the totals refresh, and the watcher (loaded now
// when shard 0 answers, else retried every second in the background).
func (g *Gateway) initAdmission() error {
	dbs := make([]shard.Querier, len(g.shards))
	pools := make([]shard.Beginner, len(g.shards))
	for i, p := range g.shards {
		dbs[i], pools[i] = p, g.leasePools[i]
	}
	s := g.cfg.Settings
	a := &admission{totals: tenantcap.NewTotals(dbs, s.Refresh)}
	leases, err := tenantcap.NewLeases(tenantcap.LeasesOptions{Shards: pools, MaxRuns: s.MaxRuns})
	if err != nil {
		return fmt.Errorf("gateway: admission: %w", err)
	}
	a.leases = leases
	a.watcher = tenantcap.NewWatcher(tenantcap.WatcherOptions{
		Shard0: g.shards[0], NATS: g.nc, Prefix: g.cfg.SubjectPrefix, Reload: s.Reload, Log: g.log,
	})
	adm, err := tenantcap.NewAdmitter(tenantcap.AdmitterOptions{
		MaxRuns: s.MaxRuns,
		Config:  a.watcher.Config,
		Tenants: g.tokens.Tenants,
		Totals:  a.totals,
		Leases:  leases,
	})
	if err != nil {
		return fmt.Errorf("gateway: admission: %w", err)
	}
	a.adm = adm
	if a.decisions, err = g.meter.Int64Counter("harvest.gateway.admission.decisions",
		metric.WithDescription("Admission decisions on new runs, by outcome (admitted, refused_tenant_limit, refused_system_limit, config_not_loaded, error)."),
		metric.WithUnit("{decision}")); err != nil {
		return fmt.Errorf("gateway: metrics: %w", err)
	}
	a.outcomes = map[string]metric.MeasurementOption{}
	for _, o := range []string{admitAdmitted, admitRefusedTenant, admitRefusedSystem, admitNotLoaded, admitError} {
		a.outcomes[o] = metric.WithAttributeSet(attribute.NewSet(attribute.String("outcome", o)))
	}
	ctx, cancel := context.WithCancel(context.Background())
	a.ctx, a.cancel = ctx, cancel
	a.bg.Go(func() {
		a.totals.Run(ctx, func(err error) { g.log.Debug("admission: totals refresh", "err", err) })
	})
	a.bg.Go(func() { g.dir.Run(ctx) })
	a.bg.Go(func() {
		a.leases.Run(ctx, func(err error) { g.log.Debug("admission: capacity leases", "err", err) })
	})
	g.adm = a
	if err := a.tryLoad(ctx); err == nil {
		return nil
	} else if ctx.Err() == nil {
		g.log.Warn("admission: cannot load the configuration from shard 0 yet; new runs get 503 until it loads", "err", err)
	}
	a.bg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if a.tryLoad(ctx) == nil {
				g.log.Info("admission: configuration loaded from shard 0")
				return
			}
		}
	})
	return nil
}

// tryLoad starts the watcher when it has not started yet.
func (a *admission) tryLoad(ctx context.Context) error {
	a.loadMu.Lock()
	defer a.loadMu.Unlock()
	if a.loaded.Load() {
		return nil
	}
	if err := a.watcher.Start(ctx); err != nil {
		return err
	}
	a.loaded.Store(true)
	return nil
}

// close stops the background work and waits for it.
func (a *admission) close() {
	a.cancel()
	a.bg.Wait()
	a.loadMu.Lock()
	defer a.loadMu.Unlock()
	if a.loaded.Load() {
		a.watcher.Stop()
	}
}

// Rule implements tenantcap.Ruler: the rule the committers' statements
// judge new runs by. Before the configuration is loaded there is none, and
// every new run is refused with 503 (a replay is still answered).
func (h admitHook) Rule(shard int) (tenantcap.Rule, error) {
	if !h.a.loaded.Load() {
		return tenantcap.Rule{}, errNotLoaded()
	}
	return h.a.adm.Rule(shard)
}

// Acquire implements tenantcap.Ruler: capacity for starts the shard's lease
// could not cover.
func (h admitHook) Acquire(ctx context.Context, shard, seen, need int) (int, error) {
	return h.a.adm.Acquire(ctx, shard, seen, need)
}

// Decided implements tenantcap.Ruler: it counts a group's decisions by
// outcome.
func (h admitHook) Decided(admitted int, refused []tenantcap.Decision) {
	ctx := context.Background()
	if admitted > 0 {
		h.a.decisions.Add(ctx, int64(admitted), h.a.outcome(admitAdmitted))
	}
	for _, d := range refused {
		h.a.decisions.Add(ctx, 1, h.a.outcome(refusalOutcome(d.Reason)))
	}
}

// refusalOutcome is the decision counter's outcome of a refusal.
func refusalOutcome(r tenantcap.Reason) string {
	switch r {
	case tenantcap.ReasonSystem:
		return admitRefusedSystem
	case tenantcap.ReasonUnavailable:
		return admitNotLoaded
	}
	return admitRefusedTenant
}

// errNotLoaded refuses new runs while the configuration is not loaded.
func errNotLoaded() *api.Error {
	return api.NewError(api.CodeUnavailable, "admission: the configuration could not be read from shard 0 yet; try again shortly")
}

// admitHook is the tenantcap.Hook the committers call: tenantcap's
// rule (a tenantcap.Ruler, applied by each group's statement) and its
// decision for single starts, plus the decision counter. It carries no
// tenant label: the number of tenants is unbounded.
type admitHook struct{ a *admission }

// Admit implements tenantcap.Hook for the starts written one at a time
// (deferred starts, retries); the committers' groups use Rule.
func (h admitHook) Admit(ctx context.Context, in tenantcap.Admission) error {
	count := func(outcome string) { h.a.decisions.Add(ctx, 1, h.a.outcome(outcome)) }
	if !h.a.loaded.Load() {
		count(admitNotLoaded)
		return errNotLoaded()
	}
	d, err := h.a.adm.Check(ctx, in)
	if err != nil {
		count(admitError)
		return err
	}
	if d.Admit {
		count(admitAdmitted)
		return nil
	}
	count(refusalOutcome(d.Reason))
	return d.Err()
}

// outcome is the attribute set of one outcome of the decision counter,
// built once.
func (a *admission) outcome(name string) metric.MeasurementOption {
	if o, ok := a.outcomes[name]; ok {
		return o
	}
	return metric.WithAttributes(attribute.String("outcome", name))
}

// putAdmission applies a PUT /v1/admission body as actor (the same path
// for the API and the /admin page): persisted with its audit row on shard
// 0, in force on this gateway at once, and announced over NATS so every
// other gateway re-reads it before its next start (or within
// HARVEST_ADMISSION_RELOAD should the announcement be lost).
func (g *Gateway) putAdmission(ctx context.Context, actor string, body []byte) (tenantcap.Current, *api.Error) {
	cur, err := tenantcap.ApplyPut(ctx, g.shards[0], actor, body, g.cfg.MaxRuns)
	if err != nil {
		var ae *api.Error
		if errors.As(err, &ae) {
			return tenantcap.Current{}, ae
		}
		return tenantcap.Current{}, g.apiError(err, 0, "admission put")
	}
	g.adm.watcher.Apply(cur)
	if g.nc != nil {
		if err := tenantcap.PublishChange(ctx, g.nc, g.cfg.SubjectPrefix, cur); err != nil {
			g.log.Warn("admission: change saved but not announced; other gateways apply it at their next periodic reload", "err", err)
		} else if err := g.nc.FlushTimeout(2 * time.Second); err != nil {
			g.log.Warn("admission: flush announcement", "err", err)
		}
	}
	return cur, nil
}

// admissionView builds the GET /v1/admission body (fresh counts from every
// shard).
func (g *Gateway) admissionView(ctx context.Context) (api.AdmissionView, *api.Error) {
	dbs := make([]shard.Querier, len(g.shards))
	for i, p := range g.shards {
		dbs[i] = p
	}
	v, err := tenantcap.BuildAdmissionView(ctx, dbs, g.adm.watcher.Current(), g.adm.watcher.Ceilings(), g.adm.adm.MaxRuns(), g.tokens.Tenants())
	if err != nil {
		return v, api.NewError(api.CodeUnavailable, "no shard answered; try again later")
	}
	return v, nil
}

var _ tenantcap.Ruler = admitHook{}
