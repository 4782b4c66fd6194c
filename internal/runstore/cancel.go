package runstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/dberr"
	"github.com/harvest-run/harvest/internal/pgrow"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
)

// ErrFinished means the run completed or failed before it could be
// cancelled; the run is returned with the error.
var ErrFinished = errors.New("runstore: the run already finished")

// CancelResult is what a cancel did.
type CancelResult struct {
	Run api.Run
	// Cancelled is true when this call cancelled the run, false when it was
	// cancelled already.
	Cancelled bool
	// WasRunning is true when a task of the run was leased to a worker: that
	// worker learns of the cancel at its next heartbeat (a stale lease) and
	// its result is discarded.
	WasRunning bool
	// Notify is true when the run's end is announced on NATS (the start
	// asked for it, or a long poll waits for the run): the cancel is
	// announced then, and only then.
	Notify bool
}

// Cancel cancels the tenant's run in one statement (harvest_run_cancel):
// every unfinished task of the run leaves play, the run becomes cancelled
// and the tenant's running count drops. Cancelling a cancelled run returns
// it unchanged; a completed or failed run gives ErrFinished; an unknown id
// (or another tenant's) gives ErrNotFound.
//
// One statement, not a transaction of several: the count row it lowers is
// one that start groups wait for while they hold the shard's admission
// lock, so it is held from the function's update to the commit, never
// across round trips to the gateway.
//
// A statement the database breaks (a deadlock with a worker or a start
// group that locks the same rows in another order) is sent again, up to
// the committer's attempts: the broken one was rolled back whole.
func Cancel(ctx context.Context, db shard.Querier, tenant, id string, shard int, reason string) (CancelResult, error) {
	for attempt := 1; ; attempt++ {
		res, err := cancelOnce(ctx, db, tenant, id, shard, reason)
		if err == nil || !dberr.Conflict(err) || attempt == maxTxAttempts || ctx.Err() != nil {
			return res, err
		}
	}
}

// cancelRow is a row of RunCancel: what the cancel did, and the run.
type cancelRow struct {
	Outcome    string `db:"outcome"`
	WasRunning bool   `db:"was_running"`
	Notify     bool   `db:"notify"`
	hashedRow
}

// cancelOnce is one attempt of Cancel.
func cancelOnce(ctx context.Context, db shard.Querier, tenant, id string, shard int, reason string) (CancelResult, error) {
	row, err := pgrow.One[cancelRow](ctx, db, sqlRunCancel, tenant, id, reason)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return CancelResult{}, ErrNotFound
	case err != nil:
		return CancelResult{}, fmt.Errorf("runstore: cancel run: %w", runMovingOrErr(err))
	}
	run := row.Run(shard)
	if row.Outcome == "cancelled" {
		return CancelResult{Run: run, Cancelled: true, WasRunning: row.WasRunning, Notify: row.Notify}, nil
	}
	if run.Status == api.StatusCompleted || run.Status == api.StatusFailed {
		// Final before the cancel, or finished by a worker between the
		// function's read and its lock: either way nothing was changed.
		return CancelResult{Run: run, Notify: row.Notify}, ErrFinished
	}
	return CancelResult{Run: run, Notify: row.Notify}, nil
}
