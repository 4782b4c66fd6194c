package testsvc

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
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
