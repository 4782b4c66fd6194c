package tenantcap

import (
	"context"
	"errors"
	"fmt"

	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
)

// BuildAdmissionView reads every shard's per-tenant counts (fresh, not
// from the cache) and assembles the GET /v1/admission body for cur and
// the tenants' priority ceilings. It fails only when no shard answers.
func BuildAdmissionView(ctx context.Context, shardDBs []shard.Querier, cur Current, ceilings Ceilings, maxRuns int, tenants []string) (api.AdmissionView, error) {
	v := api.AdmissionView{
		Algorithm: cur.Algorithm, TFM: cur.TFM, MaxRuns: maxRuns, MaxRunsReadOnly: true,
		Tenants: len(tenants), Running: map[string]int{}, UpdatedBy: cur.UpdatedBy,
		ScheduledShare: cur.Share(), ScheduledCap: ScheduledCap(cur.Config, maxRuns, len(tenants)),
		PriorityCeilings: ceilings.List(),
	}
	if !cur.UpdatedAt.IsZero() {
		v.UpdatedAt = cur.UpdatedAt.UTC().Format("2006-01-02T15:04:05.000000Z07:00")
	}
	for _, t := range tenants {
		v.Running[t] = 0
	}
	var errs []error
	answers := shards.Each(ctx, shardDBs, nil, 0, func(ctx context.Context, _ int, db shard.Querier) (map[string]int, error) {
		return runningByTenant(ctx, db)
	})
	v.UnavailableShards = shards.Unavailable(answers)
	for _, a := range answers {
		if a.Err != nil {
			errs = append(errs, a.Err)
			continue
		}
		for t, n := range a.Value {
			v.Running[t] += n
			v.RunningTotal += n
		}
	}
	if len(shardDBs) > 0 && len(v.UnavailableShards) == len(shardDBs) {
		return api.AdmissionView{}, fmt.Errorf("tenantcap: no shard answered: %w", errors.Join(errs...))
	}
	if limit, limited := Limit(cur.Config, maxRuns, len(tenants), v.RunningTotal); limited {
		v.Limit = &limit
	}
	return v, nil
}

func runningByTenant(ctx context.Context, db shard.Querier) (map[string]int, error) {
	type running struct {
		Tenant  string `db:"tenant"`
		Running int    `db:"running"`
	}
	got, err := pgrow.All[running](ctx, db, sqlRunningByTenant)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(got))
	for _, r := range got {
		out[r.Tenant] = r.Running
	}
	return out, nil
}

// Usage builds the GET /v1/usage body of tenant: its exact count read from
// home (its home shard, number shard) and its limit by the rule at the current total
// (the home shard's exact count and the others' cached ones). Admit
// reaches the same limit once its shard's lease covers it (see Check).
// The ceiling is ceilings' for the tenant.
func (a *Admitter) Usage(ctx context.Context, home shard.Querier, shard int, tenant string, ceilings Ceilings) (api.UsageView, error) {
	c, err := pgrow.One[admitCounts](ctx, home, sqlAdmitRead, tenant)
	if err != nil {
		return api.UsageView{}, fmt.Errorf("tenantcap: read usage: %w", err)
	}
	cfg := a.config()
	others, _ := a.totals.Others(shard)
	u := api.UsageView{Tenant: tenant, Algorithm: cfg.Algorithm, Running: c.Own, MaxRuns: a.maxRuns,
		MaxPriority: ceilings.MaxPriority(tenant), ScheduledCap: ScheduledCap(cfg, a.maxRuns, len(a.tenants()))}
	if limit, limited := Limit(cfg, a.maxRuns, len(a.tenants()), c.Local+others); limited {
		u.Limit = &limit
	}
	return u, nil
}
