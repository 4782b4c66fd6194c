package testfactory

import (
	"context"
	"embed"
	"encoding/json"
	"testing"
	"time"

	"github.com/harvest-run/harvest/internal/sqlfile"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/shard"
)

//go:embed sql/*.sql
var sqlFiles embed.FS

var sqlRunInsert = sqlfile.Must(sqlFiles, "RunInsert")

// RunOpts describes a run; zero values are the defaults: tenant "t1", a
// random id, workflow "wf", queue "q", the default keys, 3 attempts,
// counted for its tenant.
type RunOpts struct {
	Tenant, ID, Name, Queue string
	FairnessKey, QuotaKey   string
	MaxAttempts             int
	// Uncounted leaves the tenant's running count alone.
	Uncounted bool
}

// Run inserts a run and returns its pk; a failure fails the test.
func Run(ctx context.Context, tb testing.TB, db shard.Querier, o RunOpts) int64 {
	tb.Helper()
	if o.Tenant == "" {
		o.Tenant = "t1"
	}
	if o.Name == "" {
		o.Name = "wf"
	}
	if o.Queue == "" {
		o.Queue = "q"
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = 3
	}
	var id any
	if o.ID != "" {
		id = o.ID
	}
	var pk int64
	if err := db.QueryRow(ctx, sqlRunInsert, o.Tenant, id, o.Name, o.Queue, o.FairnessKey, o.QuotaKey,
		o.MaxAttempts, !o.Uncounted).Scan(&pk); err != nil {
		tb.Fatalf("testfactory: insert run: %v", err)
	}
	return pk
}

// TaskOpts describes a task; zero values are the defaults: a new run of
// Run's options (its queue and keys the task's), queue "q", the default
// key, priority 0, due now, input {}.
type TaskOpts struct {
	RunPK        int64
	Run          RunOpts
	Queue        string
	Key          string
	QuotaKey     string
	Priority     int
	Continuation bool
	DueAt        time.Time
	StickyWorker string
	StickyUntil  time.Time
	// Now decides whether DueAt has come (zero: the database clock).
	Now time.Time
}

// Task enqueues a task, making its run first unless RunPK names one, and
// returns the run's pk and the task's id; a failure fails the test.
func Task(ctx context.Context, tb testing.TB, db shard.Querier, o TaskOpts) (runPK, taskID int64) {
	tb.Helper()
	if o.Queue == "" {
		o.Queue = "q"
	}
	if o.RunPK == 0 {
		r := o.Run
		r.Queue, r.FairnessKey, r.QuotaKey = o.Queue, o.Key, o.QuotaKey
		o.RunPK = Run(ctx, tb, db, r)
	}
	id, err := claim.Enqueue(ctx, db, claim.NewTask{
		RunPK: o.RunPK, Queue: o.Queue, Key: o.Key, QuotaKey: o.QuotaKey, Priority: o.Priority,
		Continuation: o.Continuation, DueAt: o.DueAt, StickyWorker: o.StickyWorker,
		StickyUntil: o.StickyUntil, Now: o.Now, Input: json.RawMessage(`{}`),
	})
	if err != nil {
		tb.Fatalf("testfactory: enqueue task: %v", err)
	}
	return o.RunPK, id
}
