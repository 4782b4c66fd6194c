package weights_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/weights"
)

// A page deep in the audit reads from its cursor down, also under a
// generic plan (the plan a prepared statement may keep once it has run a
// few times): the cursor is an index condition there, not a filter that
// reads every row above it.
func TestAuditPageDeepReadsFromItsCursor(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := testsvc.NewDB(t)
	for _, q := range []string{
		`INSERT INTO audit (actor, action, outcome, message)
			SELECT 'root', 'weight.set', 'ok', repeat('m', 100) || g FROM generate_series(1, 20000) g`,
		`ANALYZE audit`,
	} {
		_, err := db.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	var pages int
	require.NoError(t, db.QueryRow(ctx, `SELECT pg_relation_size('audit') / current_setting('block_size')::int`).Scan(&pages))
	require.Greater(t, pages, 100)
	var below int64
	require.NoError(t, db.QueryRow(ctx, `SELECT min(id) + 100 FROM audit`).Scan(&below))

	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	_, err = tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	blocks := testsvc.BlocksRead(ctx, t, tx, "audit")
	page, err := weights.AuditList(ctx, tx, strconv.FormatInt(below, 10), 50)
	require.NoError(t, err)
	read := blocks()
	require.Len(t, page.Entries, 50)
	require.Equal(t, below-1, page.Entries[0].ID)
	require.Less(t, read, pages/10, "heap blocks of audit read for the page, of %d", pages)
}
