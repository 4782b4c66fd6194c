package claim_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/shard"
)

// An outcome batch reads its tasks and runs through their indexes however
// small the shard was when its connection first recorded an outcome. The
// batch's statements run on plans made once per connection; made on a
// fresh shard holding one task, a plan that scans the table looks cheapest
// and would be kept as the shard grows. Measured in heap blocks of tasks
// and runs read by one batch of three completions, on the connection whose
// plans were made when the shard held one task.
func TestOutcomeBatchReadsByIndexOnAShardThatGrew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The plans are the ones this test makes: no analyze by the server's
	// autovacuum meanwhile, which would have them made again.
	for _, q := range []string{
		`ALTER TABLE tasks SET (autovacuum_enabled = false)`,
		`ALTER TABLE runs SET (autovacuum_enabled = false)`,
	} {
		_, err := b.db.Exec(b.ctx, q)
		require.NoError(t, err)
	}
	conn, err := b.db.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()

	complete := func(db shard.Querier, ls []claim.Lease) {
		t.Helper()
		outs := make([]claim.Outcome, len(ls))
		for i, l := range ls {
			outs[i] = claim.Outcome{Kind: claim.OutcomeComplete, ID: l.ID, Token: l.Token}
		}
		res, err := claim.RecordOutcomes(b.ctx, db, time.Time{}, outs)
		require.NoError(t, err)
		for _, r := range res {
			require.NoError(t, r.Err)
		}
	}
	// The connection's first outcomes, on a shard of one task: the plans
	// are made here (a generic plan from the sixth call on, so seven).
	for range 7 {
		complete(conn, b.leaseFresh(1))
	}

	// The shard grows; nothing analyzes it.
	_ = b.leaseFresh(30000)
	var pages int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT pg_relation_size('tasks') / current_setting('block_size')::int`).Scan(&pages))
	require.Greater(t, pages, 100, "the tasks span the table's pages")

	ls := b.leaseFresh(3)
	tx, err := conn.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck // a no-op after commit
	tasks, runs := testsvc.BlocksRead(b.ctx, t, tx, "tasks"), testsvc.BlocksRead(b.ctx, t, tx, "runs")
	complete(tx, ls)
	tasksRead, runsRead := tasks(), runs()
	require.NoError(t, tx.Commit(b.ctx))
	require.Less(t, tasksRead, 40, "the batch read the tasks table (%d pages)", pages)
	require.Less(t, runsRead, 40, "the batch read the runs table")
}
