package janitor_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/janitor"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
)

// noAutovacuum keeps the server's autovacuum, where it is on, off runs and
// tasks, so that the analyzes these tests count are the janitor's alone.
func (b *bundle) noAutovacuum() {
	b.t.Helper()
	_, err := b.db.Exec(b.ctx, `ALTER TABLE runs SET (autovacuum_enabled = false);
		ALTER TABLE tasks SET (autovacuum_enabled = false)`)
	require.NoError(b.t, err)
}

// analyzeCount is how often table was analyzed, by autovacuum or by hand.
func (b *bundle) analyzeCount(table string) int {
	b.t.Helper()
	return b.scalar(`SELECT analyze_count + autoanalyze_count FROM pg_stat_user_tables WHERE relname = $1`, table)
}

// A tick analyzes the tables written far past their statistics (here a
// fresh shard's runs and tasks, never analyzed), and leaves alone a table
// analyzed within DefaultAnalyzeAge and one written little since.
func TestAnalyzesTablesBehindTheirWrites(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.noAutovacuum()
	rep, err := janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.Zero(t, rep.Analyzed, "a fresh shard")

	testsvc.AddHistory(b.ctx, t, b.db, "q", 3000)
	rep, err = janitor.Tick(b.ctx, b.db, janitor.DefaultSettings())
	require.NoError(t, err)
	require.True(t, rep.Exclusive)
	require.Equal(t, 2, rep.Analyzed, "runs and tasks")
	require.Equal(t, 1, b.analyzeCount("runs"))
	require.Equal(t, 1, b.analyzeCount("tasks"))
	require.Zero(t, b.analyzeCount("audit"), "a table written little")

	// Written past the thresholds again: within the age it waits, past it
	// it is analyzed.
	_, err = b.db.Exec(b.ctx, `INSERT INTO runs (tenant, id, name, queue, request_hash)
		SELECT 'more', 'r-' || g, 'wf', 'q', '\x00' FROM generate_series(1, 3000) g`)
	require.NoError(t, err)
	_, err = b.db.Exec(b.ctx, `SELECT pg_stat_force_next_flush()`)
	require.NoError(t, err)
	n, err := janitor.AnalyzeBehind(b.ctx, b.db, time.Hour)
	require.NoError(t, err)
	require.Zero(t, n, "analyzed within the age")
	n, err = janitor.AnalyzeBehind(b.ctx, b.db, 0)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 2, b.analyzeCount("runs"))
	require.Equal(t, 1, b.analyzeCount("tasks"))
}

// A gateway's connections keep the plans of the routes a tenant calls:
// pgx prepares each statement once per connection, and the server settles
// on a generic plan after five calls, made from the statistics of that
// moment; cancel is a PL/pgSQL function, whose plans are kept the same
// way. Made while the shard was small (a sequential scan of a page or two
// is the cheapest plan then), such a plan is kept as the shard grows until
// its tables are analyzed. Where autovacuum is off or behind, the
// janitor's analyze is what makes them anew: each route, called on one
// connection until its plans settle, reads the whole runs table after the
// shard grew (510 of 510 blocks for a get, 1,535 for a cancel, measured
// before the analyzer existed), and a few blocks once the tables behind
// were analyzed. Any tenant can call these as often as its rate allows.
func TestRunRoutesPlanAnewAfterTheAnalyze(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// prepare makes a run for call on the pool, outside the measure,
		// and returns its id.
		prepare func(b *bundle) string
		call    func(b *bundle, tx pgx.Tx, id string)
	}{
		{"get", queuedRun, func(b *bundle, tx pgx.Tx, id string) {
			run, err := runstore.Get(b.ctx, tx, "acme", id, 1)
			require.NoError(b.t, err)
			require.Equal(b.t, api.StatusQueued, run.Status)
		}},
		{"why it waits", queuedRun, func(b *bundle, tx pgx.Tx, id string) {
			w, err := runstore.Waiting(b.ctx, tx, "acme", id)
			require.NoError(b.t, err)
			require.NotNil(b.t, w)
		}},
		{"start again", queuedRun, func(b *bundle, tx pgx.Tx, id string) {
			out, found, err := runstore.Existing(b.ctx, tx, []runstore.StartParams{startOf("acme", id, "shared")})
			require.NoError(b.t, err)
			require.Equal(b.t, []bool{true}, found)
			require.NoError(b.t, out[0].Err)
		}},
		{"list", queuedRun, func(b *bundle, tx pgx.Tx, _ string) {
			page, err := runstore.List(b.ctx, tx, runstore.ListParams{Tenant: "acme", Shard: 1, Limit: 5})
			require.NoError(b.t, err)
			require.NotEmpty(b.t, page.Runs)
		}},
		{"cancel queued", queuedRun, func(b *bundle, tx pgx.Tx, id string) {
			res, err := runstore.Cancel(b.ctx, tx, "acme", id, 1, "test")
			require.NoError(b.t, err)
			require.True(b.t, res.Cancelled)
		}},
		{"cancel running", func(b *bundle) string {
			id := queuedRun(b)
			got, err := claim.Claim(b.ctx, b.db, claim.Request{Queue: "shared"})
			require.NoError(b.t, err)
			require.True(b.t, got.OK)
			return id
		}, func(b *bundle, tx pgx.Tx, id string) {
			res, err := runstore.Cancel(b.ctx, tx, "acme", id, 1, "test")
			require.NoError(b.t, err)
			require.True(b.t, res.WasRunning)
		}},
		{"retry", func(b *bundle) string {
			// A queue of its own each time: the runs retried earlier wait
			// in the others.
			q := testsvc.RandomName("retry-")
			id := startRun(b, q)
			got, err := claim.Claim(b.ctx, b.db, claim.Request{Queue: q})
			require.NoError(b.t, err)
			require.True(b.t, got.OK)
			_, err = claim.Fail(b.ctx, b.db, got.Task.ID, got.Task.LeaseToken, claim.FailOptions{Error: "boom"})
			require.NoError(b.t, err)
			return id
		}, func(b *bundle, tx pgx.Tx, id string) {
			_, err := runstore.Retry(b.ctx, tx, runstore.RetryParams{Tenant: "acme", ID: id, Shard: 1, Actor: "test"})
			require.NoError(b.t, err)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.noAutovacuum()
			conn, err := b.db.Acquire(b.ctx)
			require.NoError(t, err)
			defer conn.Release()
			// A small shard, analyzed as autovacuum would have, and enough
			// calls on one connection for its plans to settle.
			_, err = b.db.Exec(b.ctx, `VACUUM ANALYZE runs, tasks`)
			require.NoError(t, err)
			for range 8 {
				id := tc.prepare(b)
				tx, err := conn.Begin(b.ctx)
				require.NoError(t, err)
				tc.call(b, tx, id)
				require.NoError(t, tx.Commit(b.ctx))
			}

			runPages, taskPages := testsvc.AddHistory(b.ctx, t, b.db, "shared", 30000)
			require.Greater(t, runPages, 300, "the history must outgrow the bound below")
			require.Greater(t, taskPages, 200, "the history must outgrow the bound below")
			n, err := janitor.AnalyzeBehind(b.ctx, b.db, 0)
			require.NoError(t, err)
			require.GreaterOrEqual(t, n, 2, "runs and tasks")
			id := tc.prepare(b)

			tx, err := conn.Begin(b.ctx)
			require.NoError(t, err)
			defer tx.Rollback(b.ctx) //nolint:errcheck // measured only
			testsvc.RequireFewBlocks(b.ctx, t, tx, 30, func() { tc.call(b, tx, id) })
		})
	}
}

// startOf is a start of run id of tenant in queue.
func startOf(tenant, id, queue string) runstore.StartParams {
	return runstore.StartParams{Tenant: tenant, Shard: 1, Req: api.StartRequest{
		ID: id, Name: "echo", Queue: queue, Input: json.RawMessage(`{"n":1}`)}}
}

// startRun starts a run of tenant acme in queue and returns its id.
func startRun(b *bundle, queue string) string {
	b.t.Helper()
	res, err := runstore.Start(b.ctx, b.db, startOf("acme", testsvc.RandomName("run-"), queue))
	require.NoError(b.t, err)
	return res.Run.ID
}

// queuedRun starts a run of tenant acme in queue shared.
func queuedRun(b *bundle) string { return startRun(b, "shared") }
