package claim_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/claim"
)

// The bulk steps force generic plans, made once per connection from the
// statistics of that moment. A plan made on a small, freshly analysed
// shard must still find its rows by index once the shard has grown (and
// its statistics, with autovacuum off or behind, still say it is small):
// a later batch on the same connection reads a few blocks of tasks and
// runs for each row it takes, not the tables. One case per bulk step a
// worker's batches take (fair, two-level, sticky, ordinary), a fair batch
// whose rows carry quota keys, and fair batches over a key (or a group)
// per row, where the fair steps join every key's head to its task.
func TestBulkPlansOutliveTheShardsGrowth(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, quota    string
		rows           int
		key            string
		fair, twoLevel bool
		sticky         bool
	}{
		{name: "fair", fair: true},
		{name: "two-level", fair: true, twoLevel: true},
		{name: "sticky", fair: true, sticky: true},
		{name: "ordinary"},
		{name: "quota", fair: true, quota: `'qk-' || r.pk % 2`},
		{name: "many keys", fair: true, rows: 2000, key: `'k-' || r.pk`},
		{name: "many groups", fair: true, twoLevel: true, rows: 2000, key: `'t' || r.pk || '/k'`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tb := setup(t)
			conn, err := tb.db.Acquire(tb.ctx)
			require.NoError(t, err)
			defer conn.Release()
			if tc.twoLevel {
				tb.exec(`SELECT harvest_queue_fairness_set('q', true, 'claims', 'test')`)
			}
			quota := `''`
			if tc.quota != "" {
				quota = tc.quota
				tb.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent) VALUES ('q', 'qk-0', 1000), ('q', 'qk-1', 1000)`)
			}
			rows, key := 200, `'t' || r.pk % 3 || '/k-' || r.pk % 10`
			if tc.rows > 0 {
				rows, key = tc.rows, tc.key
			}
			fillBacklog(tb, rows, key, quota, tc.fair)
			if tc.sticky {
				// Continuations pinned to the claiming worker, as its
				// earlier steps leave them.
				tb.exec(`UPDATE tasks SET sticky_worker = 'w', sticky_until = now() + interval '1 hour', continuation = true`)
				tb.exec(`VACUUM ANALYZE tasks`)
			}
			req := claim.Request{Queue: "q", Worker: "w", Fair: tc.fair}
			rs, err := claim.ClaimBatch(tb.ctx, conn, req, 20)
			require.NoError(t, err)
			require.Len(t, rs, 20)

			// The history, without the ANALYZE that would make the plans
			// anew.
			_, pages := testsvc.AddHistory(tb.ctx, t, tb.db, "q", 30000)
			require.Greater(t, pages, 500, "the history must outgrow the bound below")

			tx, err := conn.Begin(tb.ctx)
			require.NoError(t, err)
			defer tx.Rollback(tb.ctx) //nolint:errcheck // read only
			taskBlocks := testsvc.BlocksRead(tb.ctx, t, tx, "tasks")
			runBlocks := testsvc.BlocksRead(tb.ctx, t, tx, "runs")
			rs, err = claim.ClaimBatch(tb.ctx, tx, req, 20)
			require.NoError(t, err)
			require.Len(t, rs, 20)
			require.Less(t, taskBlocks(), 400, "blocks of tasks read by a batch of 20 (tasks has %d)", pages)
			require.Less(t, runBlocks(), 400, "blocks of runs read by a batch of 20")
		})
	}
}
