package tenantmove

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// settle makes the counts exact once every run is on D: D's count becomes
// a recount of the tenant's unfinished runs there (under the count row,
// which every start and finish of the tenant takes first), nothing is
// counted away any more, and S's count must be 0. S keeps its fence, so a
// gateway that still thinks S is the home is refused there; the fence goes
// only when the tenant moves back (fence drops the target's).
func (m *mover) settle(ctx context.Context, src, dst int) error {
	err := inTx(ctx, m.o.Shards[dst], func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlTenantRunningLock, m.tenant); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, sqlTenantRunningSet, m.tenant); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, sqlTenantAwayDrop, m.tenant)
		return err
	})
	if err != nil {
		return fmt.Errorf("tenantmove: settle the count on shard %d: %w", dst, err)
	}
	err = inTx(ctx, m.o.Shards[src], func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlTenantRunningLock, m.tenant); err != nil {
			return err
		}
		var left int64
		if err := tx.QueryRow(ctx, sqlTenantRunningSet, m.tenant).Scan(&left); err != nil {
			return err
		}
		if left != 0 {
			return fmt.Errorf("%d unfinished runs of %s are still there", left, m.tenant)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("tenantmove: settle the count on shard %d: %w", src, err)
	}
	return nil
}
