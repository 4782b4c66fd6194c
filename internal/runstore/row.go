package runstore

import (
	"encoding/json"
	"time"

	"github.com/harvest-run/harvest/pkg/api"
)

// RunRow is a run's columns as every statement that reads runs names them
// (RunGet, RunList, RunGetManyHashed, RunStart here; the console's RunListAll and
// RunInspect), scanned by name with pgx.RowToStructByName. A statement
// that leaves a column out of its answer still names it, as NULL, so that
// every reader reads runs one way.
//
// The readers read the view runs_seen (migration 0014), not the table:
// a claim does not write its run, so while an attempt is in flight the
// status, attempts and claimed_at a user sees are the stored ones with
// the run's running task folded in, and the view is the one place that
// does it. (A new run, RunStart's, has no task running: it is read as
// written.)
type RunRow struct {
	PK          int64      `db:"pk"`
	ID          string     `db:"id"`
	Tenant      string     `db:"tenant"`
	Name        string     `db:"name"`
	Queue       string     `db:"queue"`
	FairnessKey string     `db:"fairness_key"`
	QuotaKey    string     `db:"quota_key"`
	Priority    int        `db:"priority"`
	Status      string     `db:"status"`
	Attempts    int        `db:"attempts"`
	CreatedAt   time.Time  `db:"created_at"`
	ClaimedAt   *time.Time `db:"claimed_at"`
	FinishedAt  *time.Time `db:"finished_at"`
	Output      []byte     `db:"output"`
	Error       *string    `db:"error"`
}

// Run is the row as the API shows it, on shard.
func (r RunRow) Run(shard int) api.Run {
	run := api.Run{
		ID: r.ID, Tenant: r.Tenant, Name: r.Name, Queue: r.Queue, Shard: shard,
		FairnessKey: r.FairnessKey, QuotaKey: r.QuotaKey, Priority: r.Priority,
		Status: api.Status(r.Status), Attempts: r.Attempts,
		CreatedAt: api.Time{Time: r.CreatedAt}, Error: r.Error,
	}
	if r.ClaimedAt != nil {
		run.ClaimedAt = &api.Time{Time: *r.ClaimedAt}
	}
	if r.FinishedAt != nil {
		run.FinishedAt = &api.Time{Time: *r.FinishedAt}
	}
	if len(r.Output) > 0 {
		run.Output = json.RawMessage(r.Output)
	}
	return run
}

// hashedRow is a run with the hash of the request that started it
// (RunGet, RunGetManyHashed): a start that names an existing id is
// answered by comparing hashes.
type hashedRow struct {
	RunRow
	RequestHash []byte `db:"request_hash"`
}
