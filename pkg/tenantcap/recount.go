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

// Recount sets every tenant's running count on the shard db to its runs
// that are not in a final state, in its own transaction, and returns what
// it corrected. The counts change in the same transaction as their runs, so
// a recount finds nothing to fix unless something went wrong (a crash, a
// manual edit, a row deleted by hand); it is safe to run at any time, next
// to live starts and finishes.
func Recount(ctx context.Context, db Beginner) ([]Fix, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("tenantcap: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit
	fixes, err := RecountTx(ctx, tx)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("tenantcap: commit recount: %w", err)
	}
	return fixes, nil
}

// RecountTx is Recount inside a transaction the caller owns (the janitor's
// exclusive tick). It locks every count row until that transaction ends.
func RecountTx(ctx context.Context, tx pgx.Tx) ([]Fix, error) {
	if _, err := tx.Exec(ctx, sqlRecountLock); err != nil {
		return nil, fmt.Errorf("tenantcap: lock running counts: %w", err)
	}
	var fixes []Fix
	rows, err := tx.Query(ctx, sqlRecountFix)
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
	rows, err = tx.Query(ctx, sqlRecountInsert)
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
