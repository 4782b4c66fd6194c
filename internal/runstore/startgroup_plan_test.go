package runstore

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
)

// A start group's statements run under generic plans
// (harvest_start_group), made once per connection at its first group. A
// plan made on a fresh shard must still find its rows by index once the
// shard holds a long history (and its statistics still say it is empty,
// as autovacuum left them): a later group on the same connection reads
// a handful of blocks of runs and tasks, not the tables. The group has a
// start due later (its tenant's runs not due yet are counted) and one due
// now (its queue is probed for pending work).
func TestStartGroupPlansOutliveTheShardsGrowth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	conn, err := b.db.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()

	group := func(tx pgx.Tx, n int) {
		t.Helper()
		rows, err := tx.Query(b.ctx, `
			SELECT outcome FROM harvest_start_group(
				ARRAY['acme', 'acme'], ARRAY['later-' || $1::int, 'now-' || $1::int], ARRAY['echo', 'echo'],
				ARRAY['shared', 'shared'], ARRAY['k', 'k'], ARRAY['', ''], ARRAY[0, 0], ARRAY['{}', '{}'],
				ARRAY['\x00'::bytea, '\x00'::bytea], ARRAY[3, 3], ARRAY[NULL::bigint, NULL],
				ARRAY[now() + interval '1 hour', NULL], ARRAY[0::bigint, 0], ARRAY[NULL::text, NULL],
				NULL, NULL, NULL, 0, 0, 0, false, 0, false)`, n)
		require.NoError(t, err)
		outcomes, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Equal(t, []string{"new", "new"}, outcomes)
	}
	// A fresh shard, with the statistics autovacuum takes of it then.
	_, err = b.db.Exec(b.ctx, `VACUUM ANALYZE runs, tasks`)
	require.NoError(t, err)
	tx, err := conn.Begin(b.ctx)
	require.NoError(t, err)
	group(tx, 1)
	require.NoError(t, tx.Commit(b.ctx))

	// The history: finished runs of another tenant in the same queue, with
	// their done tasks; no ANALYZE, which would make the plans anew.
	runPages, taskPages := testsvc.AddHistory(b.ctx, t, b.db, "shared", 30000)
	require.Greater(t, runPages, 300)
	require.Greater(t, taskPages, 200)

	tx, err = conn.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck // committed below
	// A group of two starts reads a few blocks of each.
	testsvc.RequireFewBlocks(b.ctx, t, tx, 30, func() { group(tx, 2) })
	require.NoError(t, tx.Commit(b.ctx))
}
