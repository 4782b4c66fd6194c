package deferred

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
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
func Get(ctx context.Context, db claim.DB, tenant, id string, shard int) (api.Run, error) {
	var (
		runID, mode, state string
		firesAt            time.Time
	)
	err := db.QueryRow(ctx, sqlMemberGroup, tenant, id).Scan(&runID, &mode, &state, &firesAt)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		run, err := runstore.Get(ctx, db, tenant, id, shard)
		if err != nil || run.Status != api.StatusDeferred {
			return run, err
		}
		err = db.QueryRow(ctx, sqlGroupOfRun, tenant, id).Scan(&mode, &firesAt)
		if errors.Is(err, pgx.ErrNoRows) {
			return run, nil
		}
		if err != nil {
			return api.Run{}, fmt.Errorf("deferred: read group: %w", err)
		}
		run.RunID, run.DeferMode, run.FiresAt = id, api.DeferMode(mode), &api.Time{Time: firesAt}
		return run, nil
	case err != nil:
		return api.Run{}, fmt.Errorf("deferred: read start: %w", err)
	}
	run, err := runstore.Get(ctx, db, tenant, runID, shard)
	if err != nil {
		return api.Run{}, err
	}
	run.ID, run.RunID, run.DeferMode = id, runID, api.DeferMode(mode)
	if run.Status == api.StatusDeferred && state == statePending {
		run.FiresAt = &api.Time{Time: firesAt}
	}
	return run, nil
}
