package janitor

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/harvest-run/harvest/internal/deferred"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/shard"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// The janitor's jobs, one small type each, in the order a tick runs them.
// Each names its own limits; what a tick leaves waits for the next one.

// Every janitor of the shard runs these; they skip rows another janitor
// holds, so the work spreads over the workers and each row is done once.
var sharedJobs = []sharedJob{
	rescuer{batch: DefaultRescueBatch},
	promoter{batch: DefaultPromoteBatch},
	firer{},
}

// One janitor per tick runs these, in the transaction that holds the
// shard's janitor lock.
var lockedJobs = []lockedJob{
	retention{batch: DefaultDeleteBatch},
	bucketCollector{},
	deferredPruner{batch: DefaultDeleteBatch},
	repairScheduler{},
	pruneScheduler{},
	recountScheduler{},
}

// The same janitor runs these after that transaction committed.
var afterJobs = []afterJob{
	fairPruner{},
	fairRepairer{},
	fairVacuum{},
	recounter{},
	auditRetention{batch: DefaultAuditDeleteBatch},
	// Last: a failure here leaves no other job undone.
	analyzer{minRows: DefaultAnalyzeMinRows, share: DefaultAnalyzeShare, age: DefaultAnalyzeAge, most: DefaultAnalyzeTables},
}

// Limits of one tick.
const (
	// DefaultRescueBatch is the most expired leases put back per tick.
	DefaultRescueBatch = 1000
	// DefaultPromoteBatch is the most scheduled tasks made claimable per
	// tick.
	DefaultPromoteBatch = 10000
	// DefaultDeleteBatch is the most finished runs (and, apart, finished
	// deferred groups) deleted per tick.
	DefaultDeleteBatch = 5000
	// DefaultAuditDeleteBatch is the most audit rows deleted per tick, in
	// one statement of its own: a backlog (the retention shortened, or
	// turned on over years of rows) goes over several ticks, and no
	// transaction holds more than this many row locks.
	DefaultAuditDeleteBatch = 5000
)

// When a table's statistics count as behind (analyzer).
const (
	// DefaultAnalyzeMinRows and DefaultAnalyzeShare: a table is analyzed
	// once this many rows, plus this share of its rows, were written
	// since its last analyze. Both are above autovacuum's defaults (50
	// rows and 10%), so that where autovacuum runs it gets there first.
	DefaultAnalyzeMinRows = 1000
	DefaultAnalyzeShare   = 0.2
	// DefaultAnalyzeAge leaves alone a table analyzed this recently, by
	// autovacuum or by a janitor: a table that grows fast is analyzed at
	// most once per this, as autovacuum would (its naptime is a minute).
	DefaultAnalyzeAge = time.Minute
	// DefaultAnalyzeTables is the most tables analyzed per tick.
	DefaultAnalyzeTables = 4
)

type sharedJob interface {
	name() string
	// tolerant jobs' failures do not end the tick.
	tolerant() bool
	run(ctx context.Context, db shard.Beginner, s Settings, rep *Report) error
}

// lockedTick is what the exclusive jobs share: the locked transaction, the
// database clock read in it, and what the locked jobs found for the jobs
// after them.
type lockedTick struct {
	tx      pgx.Tx
	now     time.Time
	s       Settings
	rep     *Report
	repair  bool // the fair repair is due
	prune   bool // the prune of idle fairness state is due
	recount bool // the recount of the running counts is due
}

type lockedJob interface {
	name() string
	runLocked(ctx context.Context, t *lockedTick) error
}

type afterJob interface {
	name() string
	runAfter(ctx context.Context, db shard.Beginner, t *lockedTick) error
}

// rescuer puts back the tasks whose lease ran out (by the database clock),
// and fails the runs whose last attempt that was.
type rescuer struct{ batch int }

func (rescuer) name() string   { return "rescue expired leases" }
func (rescuer) tolerant() bool { return false }
func (j rescuer) run(ctx context.Context, db shard.Beginner, _ Settings, rep *Report) error {
	res, err := claim.RescueExpired(ctx, db, j.batch)
	rep.Requeued, rep.FailedRuns = res.Requeued, res.Failed
	return err
}

// promoter makes the scheduled tasks that fell due claimable.
type promoter struct{ batch int }

func (promoter) name() string   { return "promote due tasks" }
func (promoter) tolerant() bool { return false }
func (j promoter) run(ctx context.Context, db shard.Beginner, _ Settings, rep *Report) error {
	n, err := claim.PromoteDue(ctx, db, "", time.Time{}, j.batch)
	rep.Promoted = n
	return err
}

// firer fires the deferred starts whose time came. Groups and throttle
// keys are locked one by one and skipped when another janitor (or a
// gateway) holds them. A failure to fire one group does not hold back the
// jobs after it.
type firer struct{}

func (firer) name() string   { return "fire deferred starts" }
func (firer) tolerant() bool { return true }
func (firer) run(ctx context.Context, db shard.Beginner, _ Settings, rep *Report) error {
	fired, err := deferred.Fire(ctx, db, deferred.FireOptions{})
	rep.DeferredFired, rep.DeferredCancelled, rep.DeferredStarted = fired.Fired, fired.Cancelled, fired.Started
	return err
}

// retention deletes finished runs past the retention period, with their
// tasks.
type retention struct{ batch int }

func (retention) name() string { return "delete finished runs" }
func (j retention) runLocked(ctx context.Context, t *lockedTick) error {
	return t.tx.QueryRow(ctx, sqlRunDeleteFinal, t.s.Retention.Microseconds(), j.batch).Scan(&t.rep.DeletedRuns)
}

// bucketCollector drops idle rate-limit buckets, while the GC is on.
type bucketCollector struct{}

func (bucketCollector) name() string { return "delete idle rate buckets" }
func (bucketCollector) runLocked(ctx context.Context, t *lockedTick) error {
	if !t.s.BucketGC {
		return nil
	}
	return t.tx.QueryRow(ctx, sqlBucketDeleteIdle, t.s.BucketIdleWindow.Microseconds()).Scan(&t.rep.DeletedBuckets)
}

// deferredPruner deletes finished deferred groups.
type deferredPruner struct{ batch int }

func (deferredPruner) name() string { return "prune deferred groups" }
func (j deferredPruner) runLocked(ctx context.Context, t *lockedTick) error {
	n, err := deferred.Prune(ctx, t.tx, t.now, j.batch)
	t.rep.DeferredPruned = n
	return err
}

// dueOnce reports whether the shard's job (its row under janitor. in the
// settings table) is due: at most once per every on the shard, whichever
// janitor asks, recorded in the locked transaction so that two janitors do
// not both run it; every tick when every is 0.
func dueOnce(ctx context.Context, t *lockedTick, every time.Duration, job string) (bool, error) {
	if every <= 0 {
		return true, nil
	}
	var due bool
	err := t.tx.QueryRow(ctx, sqlJobDue, every.Microseconds(), job).Scan(&due)
	return due, err
}

// repairScheduler decides whether this tick rebuilds the fair claim's key
// heads: at most once per FairRepairInterval on the shard (never when it
// is 0).
type repairScheduler struct{}

func (repairScheduler) name() string { return "schedule the fair repair" }
func (repairScheduler) runLocked(ctx context.Context, t *lockedTick) (err error) {
	if t.s.FairRepairInterval <= 0 {
		return nil
	}
	t.repair, err = dueOnce(ctx, t, t.s.FairRepairInterval, "fair_repaired_at")
	return err
}

// pruneScheduler decides whether this tick prunes idle fairness state: at
// most once per FairPruneInterval on the shard (every tick when it is 0),
// while the GC is on.
type pruneScheduler struct{}

func (pruneScheduler) name() string { return "schedule the fairness prune" }
func (pruneScheduler) runLocked(ctx context.Context, t *lockedTick) (err error) {
	if !t.s.BucketGC {
		return nil
	}
	t.prune, err = dueOnce(ctx, t, t.s.FairPruneInterval, "fair_pruned_at")
	return err
}

// recountScheduler decides whether this tick checks the running counts:
// at most once per RecountInterval on the shard (every tick when it is 0).
type recountScheduler struct{}

func (recountScheduler) name() string { return "schedule the recount" }
func (recountScheduler) runLocked(ctx context.Context, t *lockedTick) (err error) {
	t.recount, err = dueOnce(ctx, t, t.s.RecountInterval, "recounted_at")
	return err
}

// analyzer analyzes the tables whose statistics fell far behind their
// writes, which happens only where the server's autovacuum is off or
// lags. Statistics matter beyond estimates: a plan a connection keeps (a
// prepared statement's generic plan, a PL/pgSQL function's, a foreign
// key's check) is made again only when its tables are analyzed or
// vacuumed, so a plan made while a shard was small, with a sequential
// scan that was cheap then, is otherwise kept as the tables grow, and a
// tenant's read of one run reads the whole runs table
// (TestRunRoutesPlanAnewAfterTheAnalyze). Each table is analyzed with
// SKIP_LOCKED: a table that autovacuum or a janitor is working on is
// left to the next tick, and never waited for.
type analyzer struct {
	minRows int64
	share   float64
	age     time.Duration
	most    int
}

func (analyzer) name() string { return "analyze tables behind their writes" }
func (j analyzer) runAfter(ctx context.Context, db shard.Beginner, t *lockedTick) error {
	rows, err := db.Query(ctx, sqlAnalyzeDue, j.minRows, j.share, j.age.Microseconds(), j.most)
	if err != nil {
		return err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(names) == 0 {
		return err
	}
	// The names are the catalog's, quoted by format('%I'); a statement
	// cannot take them as parameters.
	if _, err := db.Exec(ctx, "ANALYZE (SKIP_LOCKED) "+strings.Join(names, ", ")); err != nil {
		return err
	}
	t.rep.Analyzed = len(names)
	return nil
}

// fairPruner drops idle fairness state when the prune is due; each queue
// in a statement of its own under that queue's fair lock.
type fairPruner struct{}

func (fairPruner) name() string { return "prune idle fairness state" }
func (fairPruner) runAfter(ctx context.Context, db shard.Beginner, t *lockedTick) error {
	if !t.prune {
		return nil
	}
	pruned, err := claim.PruneFairState(ctx, db, t.now, t.s.BucketIdleWindow, false)
	t.rep.PrunedKeys = len(pruned)
	return err
}

// fairRepairer rebuilds key heads that are missing or wrong, when the
// repair is due.
type fairRepairer struct{}

func (fairRepairer) name() string { return "repair fairness heads" }
func (fairRepairer) runAfter(ctx context.Context, db shard.Beginner, t *lockedTick) error {
	if !t.repair {
		return nil
	}
	fixed, err := claim.Repair(ctx, db)
	for _, r := range fixed {
		t.rep.RepairedKeys += r.Repaired
	}
	return err
}

// fairVacuum vacuums the fair claim's small, hot tables.
type fairVacuum struct{}

func (fairVacuum) name() string { return "vacuum the fair claim's tables" }
func (fairVacuum) runAfter(ctx context.Context, db shard.Beginner, _ *lockedTick) error {
	_, err := db.Exec(ctx, sqlFairVacuum)
	return err
}

// recounter fixes running counts that drifted from the unfinished runs,
// when the recount is due, in its own short transaction that locks only
// the counts that drifted.
type recounter struct{}

func (recounter) name() string { return "recount running" }
func (recounter) runAfter(ctx context.Context, db shard.Beginner, t *lockedTick) error {
	if !t.recount {
		return nil
	}
	fixed, err := tenantcap.Recount(ctx, db)
	t.rep.Recounted = len(fixed)
	return err
}

// auditRetention deletes audit rows older than AuditRetention (kept for
// ever when it is 0), one batch per tick, oldest first. It runs after the
// locked transaction, in a statement of its own, so that its row locks do
// not lengthen the transaction every other exclusive job waits in; rows
// that a janitor of an overlapping tick is deleting are skipped.
type auditRetention struct{ batch int }

func (auditRetention) name() string { return "delete expired audit rows" }
func (j auditRetention) runAfter(ctx context.Context, db shard.Beginner, t *lockedTick) error {
	if t.s.AuditRetention <= 0 {
		return nil
	}
	return db.QueryRow(ctx, sqlAuditDelete, t.s.AuditRetention.Microseconds(), j.batch).Scan(&t.rep.DeletedAudit)
}
