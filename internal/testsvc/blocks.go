package testsvc

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// BlocksRead starts counting the heap blocks of table that tx fetches
// (from shared buffers or from disk) and returns the count since this
// call. Tests use it to show that a read is bounded by what it returns,
// not by the table's size: the server's per-transaction statistics count
// only tx's own reads, so other tests and background work add nothing.
func BlocksRead(ctx context.Context, t testing.TB, tx pgx.Tx, table string) func() int {
	t.Helper()
	fetched := func() int {
		t.Helper()
		var n int
		if err := tx.QueryRow(ctx, `SELECT pg_stat_get_xact_blocks_fetched($1::regclass)`, table).Scan(&n); err != nil {
			t.Fatalf("testsvc: blocks read of %s: %v", table, err)
		}
		return n
	}
	before := fetched()
	return func() int {
		t.Helper()
		return fetched() - before
	}
}

// RequireFewBlocks runs call, which uses tx, and fails t unless it read
// fewer than bound heap blocks of runs and fewer than bound of tasks. The
// plan tests pair it with AddHistory: a bound far under either table's
// size shows that every lookup of call took an index, whatever plan it
// kept from when the shard was small. The failure names the table and
// its size in pages.
func RequireFewBlocks(ctx context.Context, t testing.TB, tx pgx.Tx, bound int, call func()) {
	t.Helper()
	runBlocks := BlocksRead(ctx, t, tx, "runs")
	taskBlocks := BlocksRead(ctx, t, tx, "tasks")
	call()
	for _, read := range []struct {
		table  string
		blocks int
	}{{"runs", runBlocks()}, {"tasks", taskBlocks()}} {
		if read.blocks < bound {
			continue
		}
		var pages int
		if err := tx.QueryRow(ctx, `SELECT pg_relation_size($1::regclass) / current_setting('block_size')::int`,
			read.table).Scan(&pages); err != nil {
			t.Fatalf("testsvc: pages of %s: %v", read.table, err)
		}
		t.Errorf("read %d blocks of %s (of %d pages), want fewer than %d", read.blocks, read.table, pages, bound)
	}
}

// AddHistory gives a migrated shard a history of n finished runs in queue,
// each with its done task (under the fairness key "history", of the tenant
// "history"), without the ANALYZE that would let plans made earlier see
// it. It returns the pages of runs and tasks afterwards. With BlocksRead,
// tests use it to show that a plan made on a small shard still finds its
// rows by index once the shard has grown.
func AddHistory(ctx context.Context, t testing.TB, db *pgxpool.Pool, queue string, n int) (runPages, taskPages int) {
	t.Helper()
	// A connection of its own: the foreign key's check of each task
	// against runs keeps the plan it made at its first use on a
	// connection, and one made while runs was small scans it for every
	// row (30,000 tasks then take half a minute). Here it is made once the
	// runs are in.
	conn, err := pgx.ConnectConfig(ctx, db.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatalf("testsvc: history: connect: %v", err)
	}
	defer conn.Close(ctx) //nolint:errcheck // nothing left to flush
	if _, err := conn.Exec(ctx, `INSERT INTO runs (tenant, id, name, queue, request_hash, status, attempts, claimed_at, finished_at)
		SELECT 'history', 'done-' || g, 'wf', $1, '\x00', 'completed', 1, now(), now()
		FROM generate_series(1, $2::int) g`, queue, n); err != nil {
		t.Fatalf("testsvc: history runs: %v", err)
	}
	if _, err := conn.Exec(ctx, `INSERT INTO tasks (run_pk, queue, fairness_key, state, attempt, claimed_at)
		SELECT pk, queue, 'history', 'done', 1, now() FROM runs WHERE tenant = 'history'`); err != nil {
		t.Fatalf("testsvc: history tasks: %v", err)
	}
	// The server's counts of rows written (pg_stat_user_tables), which
	// the janitor's analyze reads, are sent before this call returns, not
	// whenever the connection's backend gets to it.
	if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatalf("testsvc: history: flush statistics: %v", err)
	}
	if err := db.QueryRow(ctx, `SELECT pg_relation_size('runs') / current_setting('block_size')::int,
		pg_relation_size('tasks') / current_setting('block_size')::int`).Scan(&runPages, &taskPages); err != nil {
		t.Fatalf("testsvc: history: pages: %v", err)
	}
	return runPages, taskPages
}
