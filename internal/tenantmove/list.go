package tenantmove

import (
	"context"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/directory"
)

// counted is one row of tenant_running.
type counted struct {
	Tenant  string `db:"tenant"`
	Running int64  `db:"running"`
}

// list merges the directory with every shard's counts. Each shard must
// answer: a list that left one out would show its tenants wrong.
func list(ctx context.Context, o Options) ([]Tenant, error) {
	if len(o.Shards) == 0 {
		return nil, fmt.Errorf("tenantmove: no shards")
	}
	entries, err := directory.List(ctx, o.Shards[0])
	if err != nil {
		return nil, fmt.Errorf("tenantmove: shard 0: %w", err)
	}
	by := map[string]*Tenant{}
	for _, e := range entries {
		by[e.Tenant] = &Tenant{Tenant: e.Tenant, Home: e.Shard, Entry: e}
	}
	for i, db := range o.Shards {
		rows, err := db.Query(ctx, sqlTenantRunningAll)
		if err != nil {
			return nil, fmt.Errorf("tenantmove: shard %d: %w", i, err)
		}
		counts, err := pgx.CollectRows(rows, pgx.RowToStructByName[counted])
		if err != nil {
			return nil, fmt.Errorf("tenantmove: shard %d: %w", i, err)
		}
		for _, c := range counts {
			t, ok := by[c.Tenant]
			if !ok {
				t = &Tenant{Tenant: c.Tenant, Home: -1, Entry: directory.Entry{Tenant: c.Tenant}}
				by[c.Tenant] = t
			}
			t.Unfinished += c.Running
		}
	}
	out := make([]Tenant, 0, len(by))
	for _, t := range by {
		if t.Home >= 0 && t.Home < len(o.Shards) {
			if err := o.Shards[t.Home].QueryRow(ctx, sqlFairStateKeyCount, t.Tenant, subKeys(t.Tenant)).Scan(&t.Keys); err != nil {
				return nil, fmt.Errorf("tenantmove: shard %d: %w", t.Home, err)
			}
		}
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tenant < out[j].Tenant })
	return out, nil
}
