package weights_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/weights"
)

// keysDB is a database holding runs and pending tasks of queue "q" made by
// stmts, with a context for the test.
func keysDB(t *testing.T, stmts ...string) (context.Context, *pgxpool.Pool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	db := testsvc.NewDB(t)
	for _, q := range stmts {
		_, err := db.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	return ctx, db
}

// inPlanModes runs read in a transaction of its own under the plans the
// statement gets on its first runs and under a generic one (the plan a
// prepared statement may keep once it has run a few times).
func inPlanModes(ctx context.Context, t *testing.T, db *pgxpool.Pool, read func(mode string, tx pgx.Tx)) {
	t.Helper()
	for _, mode := range []string{"auto", "force_generic_plan"} {
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		// A failed check ends the test here: the connection goes back to
		// the pool either way.
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op once rolled back
		_, err = tx.Exec(ctx, `SELECT set_config('plan_cache_mode', $1, true)`, mode)
		require.NoError(t, err)
		read(mode, tx)
		require.NoError(t, tx.Rollback(ctx))
	}
}

// pendingByKey is the per-key view of queue "q" bound to owner ("" for an
// operator's), as each key's pending count.
func pendingByKey(ctx context.Context, t *testing.T, tx pgx.Tx, owner, mode string) map[string]int {
	t.Helper()
	view, err := weights.KeysOwned(ctx, tx, "q", owner, 0)
	require.NoError(t, err, mode)
	pending := map[string]int{}
	for _, k := range view.Keys {
		pending[k.Key] = k.Pending
	}
	return pending
}

// A tenant's per-key view counts the pending rows of its own keys only:
// another tenant's backlog in the same queue costs it a descent of the key
// index, not a read of every row. The operator's view still counts every
// key.
func TestTenantKeysViewReadsNoOtherBacklog(t *testing.T) {
	t.Parallel()
	ctx, db := keysDB(t,
		`INSERT INTO runs (tenant, id, name, queue, request_hash)
			SELECT 'other', 'r' || g, 'echo', 'q', '\x00' FROM generate_series(1, 20000) g`,
		`INSERT INTO tasks (run_pk, queue, fairness_key) SELECT pk, 'q', 'flood' FROM runs WHERE tenant = 'other'`,
		`INSERT INTO runs (tenant, id, name, queue, request_hash)
			SELECT 'acme', 'a' || g, 'echo', 'q', '\x00' FROM generate_series(1, 6) g`,
		`INSERT INTO tasks (run_pk, queue, fairness_key)
			SELECT pk, 'q', CASE WHEN id IN ('a1', 'a2', 'a3') THEN 'acme' WHEN id IN ('a4', 'a5') THEN 'acme/x' ELSE 'acmex' END
			FROM runs WHERE tenant = 'acme'`)
	inPlanModes(ctx, t, db, func(mode string, tx pgx.Tx) {
		blocks := testsvc.BlocksRead(ctx, t, tx, "tasks")
		pending := pendingByKey(ctx, t, tx, "acme", mode)
		read := blocks()
		t.Logf("%s: %d heap blocks of tasks read for the tenant's view", mode, read)
		require.Equal(t, map[string]int{"acme": 3, "acme/x": 2}, pending, mode)
		require.Less(t, read, 100, "%s: heap blocks of tasks read for a tenant's view beside 20,000 rows of another's", mode)

		require.Equal(t, map[string]int{"acme": 3, "acme/x": 2, "acmex": 1, "flood": 20000},
			pendingByKey(ctx, t, tx, "", mode), mode)
	})
}

// In a queue of more keys than the walk takes (1,000), a tenant's view
// counts the queue's rows instead, with the same answer: the tenant's keys
// sort after the first thousand, which the walk never reaches.
func TestTenantKeysViewAmongManyKeys(t *testing.T) {
	t.Parallel()
	ctx, db := keysDB(t,
		`INSERT INTO runs (tenant, id, name, queue, request_hash)
			SELECT 'other', 'r' || g, 'echo', 'q', '\x00' FROM generate_series(1, 1500) g`,
		`INSERT INTO tasks (run_pk, queue, fairness_key) SELECT pk, 'q', 'other/' || id FROM runs WHERE tenant = 'other'`,
		`INSERT INTO runs (tenant, id, name, queue, request_hash)
			SELECT 'zeta', 'a' || g, 'echo', 'q', '\x00' FROM generate_series(1, 3) g`,
		`INSERT INTO tasks (run_pk, queue, fairness_key)
			SELECT pk, 'q', CASE WHEN id = 'a1' THEN 'zeta' ELSE 'zeta/' || id END FROM runs WHERE tenant = 'zeta'`)
	inPlanModes(ctx, t, db, func(mode string, tx pgx.Tx) {
		require.Equal(t, map[string]int{"zeta": 1, "zeta/a2": 1, "zeta/a3": 1}, pendingByKey(ctx, t, tx, "zeta", mode), mode)
	})
}
