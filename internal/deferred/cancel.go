package deferred

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/dberr"
	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
)

var (
	sqlCancelTarget      = sqlfile.Must(sqlFiles, "CancelTarget")
	sqlRunStatus         = sqlfile.Must(sqlFiles, "RunStatus")
	sqlRunDeferredCancel = sqlfile.Must(sqlFiles, "RunDeferredCancel")
	sqlGroupCancelOfRun  = sqlfile.Must(sqlFiles, "GroupCancelOfRun")
)

// Cancel cancels what an id of the tenant stands for, whatever the state
// of its deferred start:
//   - the start of a debounce window or batch: the run of its group, so
//     the whole window or batch is cancelled (there is one run for all of
//     its starts);
//   - a run still waiting as deferred (a throttled start, or the run of a
//     window or batch by its own id): the run becomes cancelled, releases
//     its admission slot, and its group never fires;
//   - a run that fired already, or an ordinary run: runstore.Cancel.
//
// A waiting run is cancelled under the tenant's count lock, which every
// accept and firer of the tenant takes first, so a cancel racing the
// firing of the same group either cancels the waiting run (the firer then
// finds it cancelled and closes the group) or comes after the firing and
// cancels the run it became. Either way the run is cancelled once the call
// returns without error.
//
// For a member start's id, Run.ID in the result is that id and Run.RunID
// the run's, as Get answers. Errors are those of runstore.Cancel:
// ErrNotFound, ErrFinished.
func Cancel(ctx context.Context, db shard.Beginner, tenant, id string, shard int, reason string) (runstore.CancelResult, error) {
	t, err := pgrow.One[cancelTarget](ctx, db, sqlCancelTarget, tenant, id)
	if err != nil {
		return runstore.CancelResult{}, fmt.Errorf("deferred: read start: %w", err)
	}
	res, err := cancelRun(ctx, db, tenant, t.RunID, t.Status, shard, reason)
	if t.Mode != "" && (err == nil || errors.Is(err, runstore.ErrFinished)) {
		res.Run.ID, res.Run.RunID, res.Run.DeferMode = id, t.RunID, t.Mode
	}
	return res, err
}

// cancelTarget is what CancelTarget reads: the run a cancel aims at, the
// group's mode when the id was a member start's, and the run's status
// (nil: no such run).
type cancelTarget struct {
	memberOf
	Status *string `db:"status"`
}

// cancelRun cancels run runID, whose status was read as status (nil: not
// found) just before; an attempt the database broke reads it again.
func cancelRun(ctx context.Context, db shard.Beginner, tenant, runID string, status *string, shard int, reason string) (runstore.CancelResult, error) {
	for attempt := 1; ; attempt++ {
		if attempt > 1 {
			status = new(string)
			err := db.QueryRow(ctx, sqlRunStatus, tenant, runID).Scan(status)
			if errors.Is(err, pgx.ErrNoRows) {
				status = nil
			} else if err != nil {
				return runstore.CancelResult{}, fmt.Errorf("deferred: read run: %w", err)
			}
		}
		if status == nil {
			return runstore.CancelResult{}, runstore.ErrNotFound
		}
		if *status != string(api.StatusDeferred) {
			return runstore.Cancel(ctx, db, tenant, runID, shard, reason)
		}
		res, waited, err := cancelWaiting(ctx, db, tenant, runID, shard, reason)
		switch {
		case err != nil && dberr.Retryable(err) && attempt < maxTxAttempts:
			continue
		case err != nil:
			return runstore.CancelResult{}, err
		case !waited:
			// It fired between the read and the lock: cancel the run it
			// became.
			return runstore.Cancel(ctx, db, tenant, runID, shard, reason)
		}
		return res, nil
	}
}

// cancelWaiting cancels a run that waits as deferred, under the tenant's
// count lock; waited is false when the run no longer waited once locked.
func cancelWaiting(ctx context.Context, db shard.Beginner, tenant, runID string, shard int, reason string) (runstore.CancelResult, bool, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return runstore.CancelResult{}, false, fmt.Errorf("deferred: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit
	if _, err := tx.Exec(ctx, sqlTenantRunningLock, tenant); err != nil {
		return runstore.CancelResult{}, false, fmt.Errorf("deferred: lock running count: %w", err)
	}
	waiting, waits, err := lockWaitingRun(ctx, tx, tenant, runID)
	if err != nil || !waits {
		return runstore.CancelResult{}, false, err
	}
	if _, err := tx.Exec(ctx, sqlRunDeferredCancel, waiting.PK, reason); err != nil {
		return runstore.CancelResult{}, false, fmt.Errorf("deferred: cancel waiting run: %w", err)
	}
	if _, err := tx.Exec(ctx, sqlGroupCancelOfRun, tenant, runID); err != nil {
		return runstore.CancelResult{}, false, fmt.Errorf("deferred: close cancelled group: %w", err)
	}
	run, err := runstore.Get(ctx, tx, tenant, runID, shard)
	if err != nil {
		return runstore.CancelResult{}, false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return runstore.CancelResult{}, false, fmt.Errorf("deferred: commit cancel: %w", err)
	}
	return runstore.CancelResult{Run: run, Cancelled: true, Notify: waiting.Notify}, true, nil
}
