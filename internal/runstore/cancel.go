package runstore

import (
	"context"
	"errors"
	"fmt"
	"time"

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
}

// Cancel cancels the tenant's run in one transaction: every unfinished task
// of the run leaves play (see TaskCancelByRun.sql), the run becomes
// cancelled and the tenant's running count drops. Cancelling a cancelled
// run returns it unchanged; a completed or failed run gives ErrFinished; an
// unknown id (or another tenant's) gives ErrNotFound.
//
// A transaction the database breaks (a deadlock with a worker or a start
// group that locks the same rows in another order) is tried again, up to the
// committer's attempts: the broken attempt was rolled back whole, so the
// next one starts afresh.
func Cancel(ctx context.Context, db shard.Beginner, tenant, id string, shard int, reason string) (CancelResult, error) {
	for attempt := 1; ; attempt++ {
		res, err := cancelOnce(ctx, db, tenant, id, shard, reason)
		if err == nil || !dberr.Conflict(err) || attempt == maxTxAttempts || ctx.Err() != nil {
			return res, err
		}
	}
}

// cancelOnce is one attempt of Cancel, in one transaction.
func cancelOnce(ctx context.Context, db shard.Beginner, tenant, id string, shard int, reason string) (CancelResult, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return CancelResult{}, fmt.Errorf("runstore: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit

	before, err := pgrow.One[runStatus](ctx, tx, sqlRunLock, tenant, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return CancelResult{}, ErrNotFound
	}
	if err != nil {
		return CancelResult{}, fmt.Errorf("runstore: read run: %w", err)
	}
	pk := before.PK
	var res CancelResult
	if !before.Status.Final() {
		first, err := cancelTasks(ctx, tx, pk)
		if err != nil {
			return CancelResult{}, err
		}
		// A continuation committed while the first pass waited for the task
		// lock is visible to this later statement: take it out too (and,
		// when a worker claimed it meanwhile, its attempt). Any later
		// continuation needs the old lease, which is void now.
		again, err := cancelTasks(ctx, tx, pk)
		if err != nil {
			return CancelResult{}, err
		}
		ended := first.add(again)
		res.WasRunning = ended.running > 0
		// The attempts the passes took out end with the run: the claim did
		// not count them, so the cancel does (harvest_run_finish).
		if _, err := tx.Exec(ctx, sqlRunFinish, pk, string(api.StatusCancelled), reason,
			ended.running, ended.firstClaim); err != nil {
			return CancelResult{}, fmt.Errorf("runstore: cancel run: %w", err)
		}
		// The update above holds the run's row, which a move takes before
		// it copies the run: a move that got there first shows here, and
		// the cancel is rolled back, to be sent to the new home.
		var moving bool
		if err := tx.QueryRow(ctx, sqlRunMoveCheck, pk).Scan(&moving); err != nil {
			return CancelResult{}, fmt.Errorf("runstore: cancel run: %w", err)
		}
		if moving {
			return CancelResult{}, ErrRunMoving
		}
	}
	run, _, err := get(ctx, tx, tenant, id, shard)
	if err != nil {
		return CancelResult{}, err
	}
	res.Run = run
	switch run.Status {
	case api.StatusCancelled:
		res.Cancelled = !before.Status.Final()
	case api.StatusCompleted, api.StatusFailed:
		// Finished by a worker between the read above and the update: the
		// update left it alone, and so does the commit below.
		return CancelResult{Run: run}, ErrFinished
	}
	if err := tx.Commit(ctx); err != nil {
		return CancelResult{}, fmt.Errorf("runstore: commit cancel: %w", err)
	}
	return res, nil
}

// cancelled is what a pass of cancelTasks took out of a worker's hands:
// how many running tasks (attempts in flight) and the earliest claim time
// among them (nil: none).
type cancelled struct {
	running    int
	firstClaim *time.Time
}

// add is both passes' attempts together.
func (c cancelled) add(o cancelled) cancelled {
	c.running += o.running
	if o.firstClaim != nil && (c.firstClaim == nil || o.firstClaim.Before(*c.firstClaim)) {
		c.firstClaim = o.firstClaim
	}
	return c
}

// cancelledTask is a row of TaskCancelByRun: the state a task was in.
type cancelledTask struct {
	State     string     `db:"state"`
	ClaimedAt *time.Time `db:"claimed_at"`
}

// cancelTasks takes the run's unfinished tasks out of play and reports
// the attempts in flight among them.
func cancelTasks(ctx context.Context, tx pgx.Tx, pk int64) (cancelled, error) {
	tasks, err := pgrow.All[cancelledTask](ctx, tx, sqlTaskCancelByRun, pk)
	if err != nil {
		return cancelled{}, fmt.Errorf("runstore: cancel tasks: %w", err)
	}
	var c cancelled
	for _, t := range tasks {
		if t.State == "running" {
			c = c.add(cancelled{running: 1, firstClaim: t.ClaimedAt})
		}
	}
	return c, nil
}

// runStatus is what RunLock reads of a run.
type runStatus struct {
	PK     int64      `db:"pk"`
	Status api.Status `db:"status"`
}
