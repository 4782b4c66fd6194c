package runstore

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

// A start into a queue whose backlog has just been claimed reads none of
// the rows the backlog left behind. The start asks whether its queue
// already had pending work; asked as a plain EXISTS, statistics taken
// while the backlog was pending made a scan of the table look cheapest,
// and that scan read every finished row before the one still pending: in
// the fleet benchmark, a light tenant's start into the flood's queue took
// 50 to 180 ms. Both ways a start is written (a group, and one start
// alone) are measured in heap blocks of tasks read by the start's own
// transaction.
func TestStartIntoDrainedQueueReadsNoBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const backlog = 20000
	for _, q := range []string{
		// Its statistics are the ones this test sets up, whatever the
		// server's autovacuum does meanwhile.
		`ALTER TABLE tasks SET (autovacuum_enabled = false)`,
		fmt.Sprintf(`INSERT INTO runs (tenant, id, name, queue, fairness_key, request_hash, status)
			SELECT 'flood', 'flood-' || g, 'echo', 'drained', 'flood', '\x00', 'queued' FROM generate_series(1, %d) g`, backlog),
		`INSERT INTO tasks (run_pk, queue, fairness_key, state) SELECT pk, 'drained', 'flood', 'pending' FROM runs ORDER BY pk`,
		`ANALYZE tasks`,
		// Claimed and done from the front, as a fleet drains it: the last
		// row is still pending.
		`UPDATE tasks SET state = 'done' WHERE id < (SELECT max(id) FROM tasks)`,
		// Vacuumed but not analyzed: the index no longer holds the old
		// versions, and the statistics still say the queue is all pending.
		// (Without the vacuum, a probe through the index would also visit
		// each old version's page until an index scan marks its entry dead,
		// which a transaction of another database running meanwhile can
		// keep it from doing.)
		`VACUUM tasks`,
	} {
		_, err := b.db.Exec(b.ctx, q)
		require.NoError(t, err)
	}
	total := b.count(t, `SELECT relpages FROM pg_class WHERE relname = 'tasks'`)
	require.Greater(t, total, 100, "the backlog spans the table's pages")

	// read runs write in a transaction of its own and returns the heap
	// blocks of tasks that transaction read.
	read := func(t *testing.T, write func(ctx context.Context, tx pgx.Tx) bool) int {
		t.Helper()
		tx, err := b.db.Begin(b.ctx)
		require.NoError(t, err)
		defer tx.Rollback(b.ctx) //nolint:errcheck // a no-op after commit
		blocks := testsvc.BlocksRead(b.ctx, t, tx, "tasks")
		require.True(t, write(b.ctx, tx), "the queue had pending work before the start")
		read := blocks()
		require.NoError(t, tx.Commit(b.ctx))
		return read
	}
	group := func(id string) func(ctx context.Context, tx pgx.Tx) bool {
		return func(ctx context.Context, tx pgx.Tx) bool {
			it := &pending{p: StartParams{Tenant: "light", Shard: 1, Req: api.StartRequest{
				ID: id, Name: "echo", Queue: "drained", Input: json.RawMessage(`{}`)}}}
			var err error
			it.row, err = startRowOf(&it.p)
			require.NoError(t, err)
			g := newGroup([]*pending{it})
			rows, err := tx.Query(ctx, sqlRunStartGroup, groupArgs(g, nil, false)...)
			require.NoError(t, err)
			got, err := pgx.CollectRows(rows, pgx.RowToStructByName[startedRow])
			require.NoError(t, err)
			require.Len(t, got, 1)
			require.Equal(t, outcomeNew, got[0].Outcome)
			return got[0].Busy
		}
	}
	alone := func(id string) func(ctx context.Context, tx pgx.Tx) bool {
		return func(ctx context.Context, tx pgx.Tx) bool {
			p := StartParams{Tenant: "light", Shard: 1, Req: api.StartRequest{
				ID: id, Name: "echo", Queue: "drained", Input: json.RawMessage(`{}`)}}
			row, err := startRowOf(&p)
			require.NoError(t, err)
			res, ok, err := startNew(ctx, tx, &row, 1)
			require.NoError(t, err)
			require.True(t, ok)
			return res.QueueBusy
		}
	}

	for i := range 3 {
		require.Less(t, read(t, group(fmt.Sprint("group-", i))), 20,
			"a start group read the queue's finished rows (the table has %d pages)", total)
		require.Less(t, read(t, alone(fmt.Sprint("alone-", i))), 20,
			"a start read the queue's finished rows (the table has %d pages)", total)
	}
}
