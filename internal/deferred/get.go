package deferred

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
)

// Get reads what an id of the tenant stands for, as GET /v1/runs/{id}
// answers it:
//   - the start of a debounce window or batch: the run of its group, with
//     Run.ID the start's id, RunID the run's and DeferMode set; status
//     deferred and FiresAt while the group waits;
//   - a run waiting as deferred (a throttled start, or the run of a window
//     or batch asked for by its own id): status deferred, FiresAt, RunID;
//   - any other run: the run as runstore.Get reads it.
//
// It returns runstore.ErrNotFound when the tenant has nothing by that id.
func Get(ctx context.Context, db shard.Querier, tenant, id string, shard int) (api.Run, error) {
	m, err := pgrow.One[memberGroup](ctx, db, sqlMemberGroup, tenant, id)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		run, err := runstore.Get(ctx, db, tenant, id, shard)
		if err != nil || run.Status != api.StatusDeferred {
			return run, err
		}
		g, err := pgrow.One[pendingGroup](ctx, db, sqlGroupOfRun, tenant, id)
		if errors.Is(err, pgx.ErrNoRows) {
			return run, nil
		}
		if err != nil {
			return api.Run{}, fmt.Errorf("deferred: read group: %w", err)
		}
		run.RunID, run.DeferMode, run.FiresAt = id, g.Mode, &api.Time{Time: g.FiresAt}
		return run, nil
	case err != nil:
		return api.Run{}, fmt.Errorf("deferred: read start: %w", err)
	}
	run, err := runstore.Get(ctx, db, tenant, m.RunID, shard)
	if err != nil {
		return api.Run{}, err
	}
	run.ID, run.RunID, run.DeferMode = id, m.RunID, m.Mode
	if run.Status == api.StatusDeferred && m.State == statePending {
		run.FiresAt = &api.Time{Time: m.FiresAt}
	}
	return run, nil
}

// memberOf is what a member start stands for: the run its group fires and
// the group's mode.
type memberOf struct {
	RunID string        `db:"run_id"`
	Mode  api.DeferMode `db:"mode"`
}

// memberGroup is what MemberGroup reads: memberOf with the group's state
// and the time it fires.
type memberGroup struct {
	memberOf
	State   string    `db:"state"`
	FiresAt time.Time `db:"fires_at"`
}

// pendingGroup is what GroupOfRun reads of the pending group of a run.
type pendingGroup struct {
	Mode    api.DeferMode `db:"mode"`
	FiresAt time.Time     `db:"fires_at"`
}
