package tenantcap

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Fix is one count a recount corrected.
type Fix struct {
	Tenant string `json:"tenant"`
	Was    int    `json:"was"`
	Now    int    `json:"now"`
	// Created is true when the tenant had unfinished runs but no count row.
	Created bool `json:"created,omitempty"`
}

// Drift lists the tenants whose running count on the shard differs from
// their unfinished runs, without taking a lock: one read in one snapshot,
// in which a run and its count always agree unless the count drifted. Was
// is the stored count, Now the recount, Created marks a missing count row.
func Drift(ctx context.Context, db DB) ([]Fix, error) {
	rows, err := db.Query(ctx, sqlRecountDrift)
	if err != nil {
		return nil, fmt.Errorf("tenantcap: read drift: %w", err)
	}
	fixes, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Fix, error) {
		var (
			f        Fix
			was, now int64
		)
		err := r.Scan(&f.Tenant, &was, &now, &f.Created)
		f.Was, f.Now = int(was), int(now)
		return f, err
	})
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
// tick and safe next to live starts and finishes.
func Recount(ctx context.Context, db Beginner) ([]Fix, error) {
	drift, err := Drift(ctx, db)
	if err != nil || len(drift) == 0 {
		return nil, err
	}
	tenants := make([]string, len(drift))
	for i, f := range drift {
		tenants[i] = f.Tenant
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("tenantcap: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit
	fixes, err := recountTx(ctx, tx, tenants)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("tenantcap: commit recount: %w", err)
	}
	return fixes, nil
}

// RecountTx recounts every tenant inside a transaction the caller owns,
// locking every count row until that transaction ends. Prefer Recount,
// which locks only what drifted.
func RecountTx(ctx context.Context, tx pgx.Tx) ([]Fix, error) {
	return recountTx(ctx, tx, nil)
}

// recountTx locks and fixes the counts of tenants (nil: all of them).
func recountTx(ctx context.Context, tx pgx.Tx, tenants []string) ([]Fix, error) {
	if _, err := tx.Exec(ctx, sqlRecountLock, tenants); err != nil {
		return nil, fmt.Errorf("tenantcap: lock running counts: %w", err)
	}
	var fixes []Fix
	rows, err := tx.Query(ctx, sqlRecountFix, tenants)
	if err != nil {
		return nil, fmt.Errorf("tenantcap: recount: %w", err)
	}
	for rows.Next() {
		var (
			f        Fix
			was, now int64
		)
		if err := rows.Scan(&f.Tenant, &was, &now); err != nil {
			rows.Close()
			return nil, fmt.Errorf("tenantcap: recount: %w", err)
		}
		f.Was, f.Now = int(was), int(now)
		fixes = append(fixes, f)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tenantcap: recount: %w", err)
	}
	rows, err = tx.Query(ctx, sqlRecountInsert, tenants)
	if err != nil {
		return nil, fmt.Errorf("tenantcap: recount missing rows: %w", err)
	}
	for rows.Next() {
		var (
			f   Fix
			now int64
		)
		if err := rows.Scan(&f.Tenant, &now); err != nil {
			rows.Close()
			return nil, fmt.Errorf("tenantcap: recount missing rows: %w", err)
		}
		f.Now, f.Created = int(now), true
		fixes = append(fixes, f)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("tenantcap: recount missing rows: %w", err)
	}
	return fixes, nil
}
