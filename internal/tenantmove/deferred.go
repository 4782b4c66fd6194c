package tenantmove

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// moveDeferred moves the tenant's deferred starts from S to D: every group
// (pending, fired or cancelled, so throttle windows and replays of member
// starts answer the same on D), its member starts, and the runs that wait
// as 'deferred' for a pending group. It returns the runs moved.
//
// Why here and not after the copy loop: S's janitor cannot fire a pending
// group of a fenced tenant, since the fired run is written by the start
// statement, which checks the fence. Waiting for the groups to fire on S
// would wait for ever; so they move while they wait, and fire on D.
//
// Why before the switch: the member starts' ids are reserved against
// ordinary runs by the trigger runs_reserve_deferred_ids, which only looks
// at the shard it runs on. Written before D takes the tenant's starts, the
// reservations are there from D's first start; and the runs the copy loop
// writes later cannot trip the trigger, since S's own trigger kept their
// ids apart from the member starts'.
//
// A cancel of a waiting run (deferred.Cancel) does not look at move_out,
// so this step holds the tenant's count row on S, which that cancel, the
// firers and deferred accepts all take first, from the read on S through
// the write on D to the delete on S. A crash between D's commit and S's
// leaves both holding the rows; the rerun writes nothing new on D and
// deletes them on S.
func (m *mover) moveDeferred(ctx context.Context, src, dst int) (int, error) {
	moved := 0
	err := inTx(ctx, m.o.Shards[src], func(tx pgx.Tx) error {
		moved = 0
		if _, err := tx.Exec(ctx, sqlTenantRunningLock, m.tenant); err != nil {
			return err
		}
		groups, err := collectPKs(tx.Query(ctx, sqlDeferredGroupLock, m.tenant))
		if err != nil {
			return err
		}
		waiting, err := collectPKs(tx.Query(ctx, sqlDeferredRunLock, m.tenant))
		if err != nil {
			return err
		}
		if len(groups) == 0 && len(waiting) == 0 {
			return nil
		}
		var groupRows, startRows, runRows json.RawMessage
		if err := tx.QueryRow(ctx, sqlDeferredGroupRead, groups).Scan(&groupRows); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, sqlDeferredStartRead, groups).Scan(&startRows); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, sqlRunCopyRead, waiting).Scan(&runRows); err != nil {
			return err
		}
		carry := func(dtx pgx.Tx) error {
			if _, err := dtx.Exec(ctx, sqlDeferredGroupCarry, string(groupRows)); err != nil {
				return err
			}
			_, err := dtx.Exec(ctx, sqlDeferredStartCarry, string(startRows))
			return err
		}
		if len(waiting) == 0 {
			// History only: nothing to count.
			if err := inTx(ctx, m.o.Shards[dst], carry); err != nil {
				return fmt.Errorf("write shard %d: %w", dst, err)
			}
		} else if _, err := m.write(ctx, src, dst, runRows, carry, nil); err != nil {
			return fmt.Errorf("write shard %d: %w", dst, err)
		}
		if moved, err = m.dropRuns(ctx, tx, waiting); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, sqlDeferredGroupDrop, groups)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("tenantmove: move deferred starts from shard %d: %w", src, err)
	}
	return moved, nil
}
