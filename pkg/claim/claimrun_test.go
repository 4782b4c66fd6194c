package claim_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/claim"
)

// runFields is what a worker needs of a claimed task's run, as a user sees
// it.
type runFields struct {
	Tenant      string `db:"tenant"`
	ID          string `db:"id"`
	Name        string `db:"name"`
	Status      string `db:"status"`
	MaxAttempts int    `db:"max_attempts"`
	TimeoutMS   *int64 `db:"timeout_ms"`
}

// runOf reads the run of task id as a user sees it now (runs_seen: the
// claim writes no run, and a run whose task runs shows running).
func (b *bundle) runOf(id int64) runFields {
	b.t.Helper()
	rows, err := b.db.Query(b.ctx, `SELECT r.tenant, r.id, r.name, r.status, r.max_attempts, r.timeout_ms
		FROM tasks t JOIN runs_seen r ON r.pk = t.run_pk WHERE t.id = $1`, id)
	require.NoError(b.t, err)
	f, err := pgx.CollectExactlyOneRow(rows, pgx.RowToStructByName[runFields])
	require.NoError(b.t, err)
	return f
}

// runTasks makes n tasks in queue with key, each of a run of its own whose
// tenant, workflow name, max_attempts and timeout differ from task to task
// (every other run has no timeout), so a claim that handed back another
// row's run, or a field of the wrong row, cannot pass.
func (b *bundle) runTasks(queue, key string, n int, o taskOpts) []int64 {
	b.t.Helper()
	ids := make([]int64, n)
	for i := range ids {
		o.Queue, o.Key = queue, key
		o.RunPK = b.run(runOpts{Tenant: fmt.Sprintf("t-%s-%s-%d", queue, key, i), Queue: queue, MaxAttempts: 2 + i})
		b.exec(`UPDATE runs SET name = $2, timeout_ms = CASE WHEN $3 THEN 1000 * $4::bigint END WHERE pk = $1`,
			o.RunPK, fmt.Sprintf("wf-%s-%d", queue, i), i%2 == 1, 1+i)
		ids[i] = b.task(o)
	}
	return ids
}

// runVersion is a run's row version (the transaction that wrote it and
// its place) and its row lock (xmax: the last transaction that locked or
// deleted it).
type runVersion struct {
	PK      int64  `db:"pk"`
	Version string `db:"version"`
}

// runVersions is the row version and lock of every run, which any write
// of a run (an update, HOT or not) and any row lock on it changes.
func (b *bundle) runVersions() []runVersion {
	b.t.Helper()
	rows, err := b.db.Query(b.ctx, `SELECT pk, concat_ws(' ', xmin, xmax, ctid) AS version FROM runs ORDER BY pk`)
	require.NoError(b.t, err)
	vs, err := pgx.CollectRows(rows, pgx.RowToStructByName[runVersion])
	require.NoError(b.t, err)
	return vs
}

// writesNoRun runs claim and requires that it neither wrote nor locked a
// run row.
func (b *bundle) writesNoRun(what string, claim func()) {
	b.t.Helper()
	before := b.runVersions()
	claim()
	require.Equal(b.t, before, b.runVersions(), "%s: a claim writes (and locks) only its task rows, no run", what)
}

// checkRun requires that each claimed task came back with its run as a
// user sees it after the claim: what the worker read after every claim
// before the claim returned it.
func (b *bundle) checkRun(what string, rs ...claim.Result) {
	b.t.Helper()
	require.NotEmpty(b.t, rs, what)
	for _, r := range rs {
		require.True(b.t, r.OK, "%s: %+v", what, r)
		want := b.runOf(r.Task.ID)
		var timeout time.Duration
		if want.TimeoutMS != nil {
			timeout = time.Duration(*want.TimeoutMS) * time.Millisecond
		}
		got := r.Task
		require.Equal(b.t, runFields{Tenant: want.Tenant, ID: want.ID, Name: want.Name, Status: want.Status,
			MaxAttempts: want.MaxAttempts}, runFields{Tenant: got.Tenant, ID: got.RunID, Name: got.Workflow,
			Status: got.RunStatus, MaxAttempts: got.MaxAttempts}, "%s: task %d", what, got.ID)
		require.Equal(b.t, timeout, got.Timeout, "%s: task %d", what, got.ID)
		require.NotEmpty(b.t, got.RunID, what)
	}
}

// Every claim entry point hands each task back with its run (tenant, id,
// workflow, status after the claim, max_attempts, timeout), so the worker
// reads nothing after a claim: the single claim by each pick (ordinary,
// ordinary with ageing, fair, fair with ageing, sticky, by id, two-level,
// runtime), the batch by each step (ordinary and fair bulk, lone key,
// single steps), and the Claimer. A run cancelled while its task waited
// comes back with its final status, which the claim leaves alone.
func TestClaimReturnsTheRunOfEachTask(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Every claim below writes no run (a claim writes its task rows
	// only), whatever the step that leases it.
	one := func(q string, req claim.Request) (r claim.Result) {
		req.Queue, req.Worker = q, "w"
		b.writesNoRun("claim of "+q, func() { r = b.claim(req) })
		return r
	}
	batch := func(q string, req claim.Request, n int) (rs []claim.Result) {
		req.Queue, req.Worker = q, "w"
		b.writesNoRun("batch of "+q, func() {
			var err error
			rs, err = claim.ClaimBatch(b.ctx, b.db, req, n)
			require.NoError(t, err)
		})
		require.Len(t, rs, n, "queue %s", q)
		return rs
	}

	b.runTasks("ord", "", 3, taskOpts{})
	b.checkRun("ordinary", one("ord", claim.Request{}))
	b.checkRun("ordinary with ageing", one("ord", claim.Request{AgingSecs: 60}))

	b.runTasks("fair", "a", 2, taskOpts{})
	b.runTasks("fair", "b", 2, taskOpts{})
	b.checkRun("fair", one("fair", claim.Request{Fair: true}))
	b.checkRun("fair with ageing", one("fair", claim.Request{Fair: true, AgingSecs: 60}))

	b.runTasks("sticky", "a", 2, taskOpts{})
	pinned := b.runTasks("sticky", "a", 1, taskOpts{StickyWorker: "w", StickyUntil: time.Now().Add(time.Hour)})
	r := one("sticky", claim.Request{Fair: true})
	require.Equal(t, pinned[0], r.Task.ID, "the pinned row first")
	b.checkRun("sticky", r)

	named := b.runTasks("byid", "a", 2, taskOpts{})
	var err error
	b.writesNoRun("claim by id", func() {
		r, err = claim.ClaimByID(b.ctx, b.db, named[1], claim.Request{Queue: "byid", Worker: "w", Fair: true})
	})
	require.NoError(t, err)
	require.Equal(t, named[1], r.Task.ID)
	b.checkRun("by id", r)

	b.exec(`SELECT harvest_queue_fairness_set('two', true, 'claims', 'test')`)
	b.runTasks("two", "g1/a", 2, taskOpts{})
	b.runTasks("two", "g2/b", 2, taskOpts{})
	b.checkRun("two-level", one("two", claim.Request{Fair: true}))
	b.checkRun("two-level batch (single steps)", batch("two", claim.Request{Fair: true}, 2)...)

	b.exec(`SELECT harvest_queue_fairness_set('rt', false, 'runtime', 'test')`)
	b.runTasks("rt", "a", 3, taskOpts{})
	b.runTasks("rt", "b", 3, taskOpts{})
	b.checkRun("runtime", one("rt", claim.Request{Fair: true}))
	b.checkRun("runtime batch (fair bulk)", batch("rt", claim.Request{Fair: true}, 3)...)

	b.runTasks("bulk", "", 4, taskOpts{})
	b.checkRun("ordinary batch (bulk)", batch("bulk", claim.Request{}, 3)...)
	b.runTasks("fbulk", "a", 3, taskOpts{})
	b.runTasks("fbulk", "b", 3, taskOpts{})
	b.checkRun("fair batch (bulk)", batch("fbulk", claim.Request{Fair: true}, 4)...)
	b.runTasks("aged", "a", 3, taskOpts{})
	b.checkRun("fair batch with ageing (single steps)", batch("aged", claim.Request{Fair: true, AgingSecs: 60}, 2)...)

	b.runTasks("lone", "a", 5, taskOpts{})
	b.checkRun("fair claim before the lone batch", one("lone", claim.Request{Fair: true})) // folds the arrivals
	var lone *string
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT harvest_queue_lone('lone', now())`).Scan(&lone))
	require.NotNil(t, lone, "the queue has one key with work: the batch takes the lone step")
	b.checkRun("lone-key batch", batch("lone", claim.Request{Fair: true}, 3)...)

	b.runTasks("comb", "a", 2, taskOpts{})
	b.writesNoRun("Claimer", func() {
		r, err = claim.NewClaimer(b.db).Claim(b.ctx, claim.Request{Queue: "comb", Worker: "w", Fair: true})
	})
	require.NoError(t, err)
	b.checkRun("Claimer", r)

	// Runs cancelled while their tasks waited: the single step and the
	// bulk steps (harvest_lease_rows) leave them cancelled and say so.
	for _, c := range []struct {
		what string
		req  claim.Request
		n    int
	}{
		{"cancelled, single", claim.Request{Fair: true}, 1},
		{"cancelled, fair bulk", claim.Request{Fair: true}, 2},
		{"cancelled, ordinary bulk", claim.Request{}, 2},
	} {
		q := fmt.Sprintf("cancel%d", c.n)
		if !c.req.Fair {
			q += "o"
		}
		b.runTasks(q, "a", 1, taskOpts{})
		b.runTasks(q, "b", 1, taskOpts{})
		b.exec(`UPDATE runs SET status = 'cancelled', finished_at = now() WHERE queue = $1 AND tenant LIKE '%-a-%'`, q)
		var rs []claim.Result
		if c.n == 1 {
			rs = []claim.Result{one(q, c.req), one(q, c.req)}
		} else {
			rs = batch(q, c.req, 2)
		}
		b.checkRun(c.what, rs...)
		statuses := map[string]bool{}
		for _, r := range rs {
			statuses[r.Task.RunStatus] = true
		}
		require.Equal(t, map[string]bool{"cancelled": true, "running": true}, statuses, c.what)
	}
}
