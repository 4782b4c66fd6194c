package tenantmove

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/directory"
)

// pin records shard as the tenant's home. Only a tenant without runs may be
// pinned: its runs would otherwise be left on a shard that is not its home
// (moving them is Move's job). Every other shard is fenced first, under
// the locks a start takes, and the runs are counted again afterwards, so a
// start that a gateway placed elsewhere meanwhile is either refused or
// seen.
func pin(ctx context.Context, o Options, tenant string, shard int) (directory.Entry, error) {
	o = o.withDefaults()
	if shard < 0 || shard >= len(o.Shards) {
		return directory.Entry{}, fmt.Errorf("tenantmove: shard %d: must name one of the %d shards", shard, len(o.Shards))
	}
	if err := validTenant(tenant); err != nil {
		return directory.Entry{}, err
	}
	unlock, err := lockTenant(ctx, o, tenant)
	if err != nil {
		return directory.Entry{}, err
	}
	defer unlock()

	e, err := directory.Get(ctx, o.Shards[0], tenant)
	exists := err == nil
	if err != nil && !errors.Is(err, directory.ErrNoEntry) {
		return directory.Entry{}, fmt.Errorf("tenantmove: %w", err)
	}
	if exists && e.Phase != directory.PhaseHome {
		return directory.Entry{}, fmt.Errorf("tenantmove: a move of %s is in progress; finish it with `harvest tenants move` first", tenant)
	}
	if err := noRuns(ctx, o, tenant); err != nil {
		return directory.Entry{}, err
	}
	for i, db := range o.Shards {
		if i == shard {
			if _, err := db.Exec(ctx, sqlTenantFenceDrop, tenant); err != nil {
				return directory.Entry{}, fmt.Errorf("tenantmove: unfence shard %d: %w", i, err)
			}
			continue
		}
		err := inTx(ctx, db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqlShardAdmissionLock); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, sqlTenantRunningLock, tenant); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sqlTenantFenceRaise, tenant, shard)
			return err
		})
		if err != nil {
			return directory.Entry{}, fmt.Errorf("tenantmove: fence shard %d: %w", i, err)
		}
	}
	// A start that landed before its shard's fence shows now; the fences
	// stay (the tenant's home is still to be decided, by a move).
	if err := noRuns(ctx, o, tenant); err != nil {
		return directory.Entry{}, err
	}
	if !exists {
		got, ok, err := directory.Insert(ctx, o.Shards[0], tenant, shard, directory.PlacedByPin)
		if err != nil {
			return directory.Entry{}, fmt.Errorf("tenantmove: %w", err)
		}
		if ok {
			announce(ctx, o, got)
			return got, nil
		}
		// A gateway placed it in between: pin that entry.
		if e, err = directory.Get(ctx, o.Shards[0], tenant); err != nil {
			return directory.Entry{}, fmt.Errorf("tenantmove: %w", err)
		}
	}
	e.Shard, e.PlacedBy = shard, directory.PlacedByPin
	got, err := directory.Update(ctx, o.Shards[0], e)
	if err != nil {
		return directory.Entry{}, fmt.Errorf("tenantmove: pin %s: %w", tenant, err)
	}
	announce(ctx, o, got)
	return got, nil
}

// noRuns refuses a tenant with runs, or a count of unfinished runs, on any
// shard.
func noRuns(ctx context.Context, o Options, tenant string) error {
	var total int64
	for i, db := range o.Shards {
		var runs, counted int64
		if err := db.QueryRow(ctx, sqlRunTenantCount, tenant).Scan(&runs); err != nil {
			return fmt.Errorf("tenantmove: count runs on shard %d: %w", i, err)
		}
		if err := db.QueryRow(ctx, sqlTenantRunningRead, tenant).Scan(&counted); err != nil {
			return fmt.Errorf("tenantmove: count runs on shard %d: %w", i, err)
		}
		total += max(runs, counted)
	}
	if total > 0 {
		return fmt.Errorf("tenantmove: tenant %s has %d runs; use `harvest tenants move` to change its home", tenant, total)
	}
	return nil
}
