package runstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/dberr"
	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

var (
	sqlRunRetryLock = sqlfile.Must(sqlFiles, "RunRetryLock")
	sqlRunRetry     = sqlfile.Must(sqlFiles, "RunRetry")
)

// ErrNotRetryable means the run cannot be retried by hand: it is not
// failed or cancelled, or it never had a task (a deferred start cancelled
// before it fired, which a new start replaces). The run is returned with
// the error when there is one.
var ErrNotRetryable = errors.New("runstore: only a failed or cancelled run that had started can be retried")

// RetryParams is one retry by hand.
type RetryParams struct {
	Tenant string
	ID     string
	Shard  int
	// Actor is who asked, for the audit row.
	Actor string
	// TraceContext is the retry's W3C trace context, given to the new task
	// so its claim links to the retry; nil keeps the start's.
	TraceContext json.RawMessage
	// Admitter judges the run as it judges a new start (it takes an
	// admission slot again); nil admits it.
	Admitter tenantcap.Hook
}

// RetryResult is what a retry did.
type RetryResult struct {
	Run api.Run
	// TaskID is the new task's id.
	TaskID int64
}

// Retry puts a failed or cancelled run back in its queue, in one
// transaction on its shard: the run is queued again with its attempts
// kept (the next claim counts on from them), a new task repeats its last
// task with a fresh budget of attempts, the tenant's count grows by one
// and the admitter judges that as it judges a start (an *api.Error such as
// 429 over_limit rolls everything back), and the audit row is written.
//
// Locks follow the start's order: the shard's admission lock and the
// tenant's count row, then the run. A tenant that moved away gives the
// fence's error (AsMoved); a run a move is copying gives ErrRunMoving; an
// unknown id ErrNotFound; a run in another status ErrNotRetryable. A
// transaction the database broke (deadlock) is tried again.
func Retry(ctx context.Context, db shard.Beginner, p RetryParams) (RetryResult, error) {
	for attempt := 1; ; attempt++ {
		res, err := retryOnce(ctx, db, p)
		if err == nil || !dberr.Conflict(err) || attempt == maxTxAttempts || ctx.Err() != nil {
			return res, err
		}
	}
}

func retryOnce(ctx context.Context, db shard.Beginner, p RetryParams) (RetryResult, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return RetryResult{}, fmt.Errorf("runstore: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit
	if _, err := tx.Exec(ctx, sqlTenantRunningLock, []string{p.Tenant}); err != nil {
		return RetryResult{}, fmt.Errorf("runstore: retry: lock the tenant's count: %w", err)
	}
	type locked struct {
		PK      int64  `db:"pk"`
		Status  string `db:"status"`
		Moving  bool   `db:"moving"`
		HasTask bool   `db:"has_task"`
	}
	rows, _ := tx.Query(ctx, sqlRunRetryLock, p.Tenant, p.ID)
	cur, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[locked])
	if errors.Is(err, pgx.ErrNoRows) {
		return RetryResult{}, ErrNotFound
	}
	if err != nil {
		if AsMoved(err) != nil {
			return RetryResult{}, err
		}
		return RetryResult{}, fmt.Errorf("runstore: retry: read run: %w", err)
	}
	if cur.Moving {
		return RetryResult{}, ErrRunMoving
	}
	status := api.Status(cur.Status)
	if (status != api.StatusFailed && status != api.StatusCancelled) || !cur.HasTask {
		run, _, err := get(ctx, tx, p.Tenant, p.ID, p.Shard)
		if err != nil {
			return RetryResult{}, err
		}
		return RetryResult{Run: run}, ErrNotRetryable
	}
	type retried struct {
		TaskID       int64 `db:"task_id"`
		Running      int   `db:"running"`
		ShardRunning int64 `db:"shard_running"`
		ShardLease   int   `db:"shard_lease"`
	}
	var trace *string
	if len(p.TraceContext) > 0 {
		s := string(p.TraceContext)
		trace = &s
	}
	rows, _ = tx.Query(ctx, sqlRunRetry, cur.PK, p.Actor, trace, cur.Status)
	done, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[retried])
	if err != nil {
		return RetryResult{}, fmt.Errorf("runstore: retry: %w", err)
	}
	run, _, err := get(ctx, tx, p.Tenant, p.ID, p.Shard)
	if err != nil {
		return RetryResult{}, err
	}
	if p.Admitter != nil {
		req := api.StartRequest{ID: run.ID, Name: run.Name, Queue: run.Queue, Priority: run.Priority}
		if err := p.Admitter.Admit(ctx, tenantcap.Admission{Shard: p.Shard, Tenant: p.Tenant, Running: done.Running,
			ShardRunning: int(done.ShardRunning), ShardLease: done.ShardLease, Req: &req}); err != nil {
			return RetryResult{}, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return RetryResult{}, fmt.Errorf("runstore: commit retry: %w", err)
	}
	return RetryResult{Run: run, TaskID: done.TaskID}, nil
}
