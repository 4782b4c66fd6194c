package worker

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
)

// drainedShard fills db as a fleet leaves a shard after working off a big
// backlog, before anything analyzed the table again: statistics that say
// every task of queue q is pending (a scan of the table then looks cheaper
// than any index), over 20,000 finished tasks followed by live pending
// ones, then runs then. It returns the table's size in pages.
func drainedShard(ctx context.Context, t *testing.T, db *pgxpool.Pool, live int, then ...string) int {
	t.Helper()
	const history = 20000
	for _, q := range append([]string{
		// Its statistics are the ones set up here, whatever the server's
		// autovacuum does meanwhile.
		`ALTER TABLE tasks SET (autovacuum_enabled = false)`,
		fmt.Sprintf(`INSERT INTO runs (tenant, id, name, queue, fairness_key, request_hash, status)
			SELECT 'a', 'r-' || g, 'echo', 'q', 'k', '\x00', 'queued' FROM generate_series(1, %d) g`, history+live),
		`INSERT INTO tasks (run_pk, queue, fairness_key, state) SELECT pk, 'q', 'k', 'pending' FROM runs`,
		`ANALYZE tasks`,
		// The statistics outlive the rows. The history comes back
		// finished, without the dead index entries an update would leave
		// (which would make any read through the index slow once, until
		// it marks them dead).
		`TRUNCATE tasks`,
		fmt.Sprintf(`INSERT INTO tasks (run_pk, queue, fairness_key, state)
			SELECT pk, 'q', 'k', CASE WHEN row_number() OVER (ORDER BY pk) <= %d THEN 'done' ELSE 'pending' END
			FROM runs`, history),
	}, then...) {
		_, err := db.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	var pages int
	require.NoError(t, db.QueryRow(ctx, `SELECT pg_relation_size('tasks') / current_setting('block_size')::int`).Scan(&pages))
	require.Greater(t, pages, 100, "the history spans the table's pages")
	return pages
}

// The backlog gauges count each queue's live tasks through the partial
// index of each state, so a scrape costs the live tasks, not the finished
// history the table keeps until retention, even on the planner's worst
// case (drainedShard).
func TestBacklogReadsNoHistory(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db := testsvc.NewDB(t)
	pages := drainedShard(ctx, t, db, 10,
		// Of the last ten, three still wait, two wait for a later time,
		// one runs, and four are another queue's.
		`UPDATE tasks SET state = 'scheduled', due_at = now() + interval '1 hour'
			WHERE id IN (SELECT id FROM tasks WHERE state = 'pending' ORDER BY id LIMIT 2)`,
		`UPDATE tasks SET state = 'running'
			WHERE id IN (SELECT id FROM tasks WHERE state = 'pending' ORDER BY id LIMIT 1)`,
		`UPDATE tasks SET queue = 'other'
			WHERE id IN (SELECT id FROM tasks WHERE state = 'pending' ORDER BY id DESC LIMIT 4)`,
		`INSERT INTO tenant_running (tenant, running) VALUES ('a', 4), ('b', 3)`,
	)

	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after the commit
	blocks := testsvc.BlocksRead(ctx, t, tx, "tasks")
	depths, total, err := readBacklog(ctx, tx, []string{"q", "empty"})
	require.NoError(t, err)
	read := blocks()
	require.NoError(t, tx.Commit(ctx))

	require.Equal(t, []queueDepth{
		{Queue: "q", Pending: 3, Scheduled: 2, Running: 1},
		{Queue: "empty"},
	}, depths)
	require.EqualValues(t, 7, total, "the tenants' running counts, summed")
	require.Less(t, read, pages/10, "heap blocks of tasks read for the gauges, of %d", pages)
}
