package tenantcap

import (
	"context"
	"fmt"

	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/pkg/shard"
	"github.com/jackc/pgx/v5"
)

// Fix is one count a recount corrected: a tenant's, or the shard's
// (Total).
type Fix struct {
	Tenant string `json:"tenant" db:"tenant"`
	Was    int    `json:"was" db:"was"`
	Now    int    `json:"now" db:"now"`
	// Created is true when the tenant had unfinished runs but no count row,
	// or, for the shard's count, when rows of shard_running were missing.
	Created bool `json:"created,omitempty" db:"created"`
	// Total marks the shard's count of unfinished runs (shard_running),
	// which must equal the sum of the tenants' counts; Tenant is empty.
	Total bool `json:"total,omitempty" db:"total"`
}

// Drift lists the tenants whose running count on the shard differs from
// their unfinished runs, and the shard's count when it differs from the
// sum of the tenants' counts, without taking a lock: one read in one
// snapshot, in which a run and its counts always agree unless a count
// drifted. Was is the stored count, Now the recount, Created marks a
// missing count row.
func Drift(ctx context.Context, db shard.Querier) ([]Fix, error) {
	fixes, err := pgrow.All[Fix](ctx, db, sqlRecountDrift)
	if err != nil {
		return nil, fmt.Errorf("tenantcap: read drift: %w", err)
	}
	return fixes, nil
}

// Recount heals the running counts of the shard db: it finds the drifted
// ones with Drift and, only when there are some, locks and fixes those rows
// in a short transaction of its own, returning what it corrected. The counts
// change in the same transaction as their runs, so normally there is
// nothing to fix and nothing is locked: it is cheap enough for every janitor
// tick and safe next to live starts and finishes. When the shard's count
// drifted, the recount holds every row of shard_running for its short
// transaction, so starts and finishes wait for it.
func Recount(ctx context.Context, db shard.Beginner) ([]Fix, error) {
	drift, err := Drift(ctx, db)
	if err != nil || len(drift) == 0 {
		return nil, err
	}
	tenants := make([]string, 0, len(drift))
	total := false
	for _, f := range drift {
		if f.Total {
			total = true
			continue
		}
		tenants = append(tenants, f.Tenant)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("tenantcap: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit
	fixes, err := recountTx(ctx, tx, tenants, total)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("tenantcap: commit recount: %w", err)
	}
	return fixes, nil
}

// RecountTx recounts every tenant and the shard's count inside a
// transaction the caller owns, locking every count row until that
// transaction ends. Prefer Recount, which locks only what drifted.
func RecountTx(ctx context.Context, tx pgx.Tx) ([]Fix, error) {
	return recountTx(ctx, tx, nil, true)
}

// recountTx locks and fixes the counts of tenants (nil: all of them; none
// when empty) and, with total, the shard's count.
func recountTx(ctx context.Context, tx pgx.Tx, tenants []string, total bool) ([]Fix, error) {
	some := tenants == nil || len(tenants) > 0
	if some {
		if _, err := tx.Exec(ctx, sqlRecountLock, tenants); err != nil {
			return nil, fmt.Errorf("tenantcap: lock running counts: %w", err)
		}
	}
	// Then the rows of the shard's count the fixes move, by stripe: the
	// fixes change it through the trigger on tenant_running.
	var made int64
	if total {
		if err := tx.QueryRow(ctx, sqlRecountTotalLock).Scan(&made); err != nil {
			return nil, fmt.Errorf("tenantcap: lock the shard's count: %w", err)
		}
	}
	if some || total {
		stripes := tenants
		if total {
			stripes = nil
		}
		if _, err := tx.Exec(ctx, sqlRecountStripesLock, stripes); err != nil {
			return nil, fmt.Errorf("tenantcap: lock the shard's count: %w", err)
		}
	}
	var fixes []Fix
	if some {
		var err error
		if fixes, err = recountTenants(ctx, tx, tenants); err != nil {
			return nil, err
		}
	}
	if !total {
		return fixes, nil
	}
	type totalFix struct {
		Was int `db:"was"`
		Now int `db:"now"`
	}
	t, err := pgrow.One[totalFix](ctx, tx, sqlRecountTotalFix)
	if err != nil {
		return nil, fmt.Errorf("tenantcap: recount the shard's count: %w", err)
	}
	if t.Was != t.Now || made > 0 {
		fixes = append(fixes, Fix{Total: true, Created: made > 0, Was: t.Was, Now: t.Now})
	}
	return fixes, nil
}

// recountTenants fixes the counts of tenants (nil: all of them), whose
// rows recountTx locked.
func recountTenants(ctx context.Context, tx pgx.Tx, tenants []string) ([]Fix, error) {
	fixes, err := pgrow.All[Fix](ctx, tx, sqlRecountFix, tenants)
	if err != nil {
		return nil, fmt.Errorf("tenantcap: recount: %w", err)
	}
	made, err := pgrow.All[Fix](ctx, tx, sqlRecountInsert, tenants)
	if err != nil {
		return nil, fmt.Errorf("tenantcap: recount missing rows: %w", err)
	}
	fixes = append(fixes, made...)
	return fixes, nil
}
