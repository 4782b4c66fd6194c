package claim_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/claim"
)

// The rows a bulk step takes are leased by id (harvest_lease_rows) under
// the generic plans the bulk steps force, made once per connection. A plan
// made on a small, freshly analysed shard must still look the ids up by
// index once the shard has grown (and its statistics, with autovacuum off
// or behind, still say it is small): a later batch on the same connection
// reads a handful of blocks of tasks and runs, not the tables.
func TestLeasePlansOutliveTheShardsGrowth(t *testing.T) {
	t.Parallel()
	tb := setup(t)
	conn, err := tb.db.Acquire(tb.ctx)
	require.NoError(t, err)
	defer conn.Release()
	fillBacklog(tb, 200, `'k-' || r.pk % 10`, `''`, true)
	req := claim.Request{Queue: "q", Worker: "w", Fair: true}
	rs, err := claim.ClaimBatch(tb.ctx, conn, req, 20)
	require.NoError(t, err)
	require.Len(t, rs, 20)

	tb.exec(`INSERT INTO runs (tenant, id, name, queue, request_hash, status, attempts, finished_at)
		SELECT 't2', 'done-' || g, 'wf', 'q', '\x00', 'completed', 1, now() FROM generate_series(1, 30000) g`)
	tb.exec(`INSERT INTO tasks (run_pk, queue, fairness_key, state, attempt)
		SELECT pk, 'q', 'old', 'done', 1 FROM runs WHERE tenant = 't2'`)

	tx, err := conn.Begin(tb.ctx)
	require.NoError(t, err)
	defer tx.Rollback(tb.ctx) //nolint:errcheck // read only
	taskBlocks := testsvc.BlocksRead(tb.ctx, t, tx, "tasks")
	runBlocks := testsvc.BlocksRead(tb.ctx, t, tx, "runs")
	rs, err = claim.ClaimBatch(tb.ctx, tx, req, 20)
	require.NoError(t, err)
	require.Len(t, rs, 20)
	require.Less(t, taskBlocks(), 150, "blocks of tasks read by a batch of 20")
	require.Less(t, runBlocks(), 150, "blocks of runs read by a batch of 20")
}
