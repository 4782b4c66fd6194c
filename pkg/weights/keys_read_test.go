package weights_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/weights"
)

// A tenant's per-key view counts the pending rows of its own keys only:
// another tenant's backlog in the same queue costs it a descent of the key
// index, not a read of every row, under the plan the statement gets on its
// first runs and under a generic one. The operator's view still counts
// every key.
func TestTenantKeysViewReadsNoOtherBacklog(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := testsvc.NewDB(t)
	for _, q := range []string{
		`INSERT INTO runs (tenant, id, name, queue, request_hash)
			SELECT 'other', 'r' || g, 'echo', 'q', '\x00' FROM generate_series(1, 20000) g`,
		`INSERT INTO tasks (run_pk, queue, fairness_key) SELECT pk, 'q', 'flood' FROM runs WHERE tenant = 'other'`,
		`INSERT INTO runs (tenant, id, name, queue, request_hash)
			SELECT 'acme', 'a' || g, 'echo', 'q', '\x00' FROM generate_series(1, 6) g`,
		`INSERT INTO tasks (run_pk, queue, fairness_key)
			SELECT pk, 'q', CASE WHEN id IN ('a1', 'a2', 'a3') THEN 'acme' WHEN id IN ('a4', 'a5') THEN 'acme/x' ELSE 'acmex' END
			FROM runs WHERE tenant = 'acme'`,
	} {
		_, err := db.Exec(ctx, q)
		require.NoError(t, err, q)
	}

	for _, mode := range []string{"auto", "force_generic_plan"} {
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		// A failed check ends the test here: the connection goes back to
		// the pool either way, so the pool's close at cleanup never waits.
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op once rolled back
		_, err = tx.Exec(ctx, `SELECT set_config('plan_cache_mode', $1, true)`, mode)
		require.NoError(t, err)
		blocks := testsvc.BlocksRead(ctx, t, tx, "tasks")
		view, err := weights.KeysOwned(ctx, tx, "q", "acme", 0)
		require.NoError(t, err, mode)
		read := blocks()
		t.Logf("%s: %d heap blocks of tasks read for the tenant's view", mode, read)
		pending := map[string]int{}
		for _, k := range view.Keys {
			pending[k.Key] = k.Pending
		}
		require.Equal(t, map[string]int{"acme": 3, "acme/x": 2}, pending, mode)
		require.Less(t, read, 100, "%s: heap blocks of tasks read for a tenant's view beside 20,000 rows of another's", mode)

		all, err := weights.KeysOwned(ctx, tx, "q", "", 0)
		require.NoError(t, err, mode)
		pending = map[string]int{}
		for _, k := range all.Keys {
			pending[k.Key] = k.Pending
		}
		require.Equal(t, map[string]int{"acme": 3, "acme/x": 2, "acmex": 1, "flood": 20000}, pending, mode)
		require.NoError(t, tx.Rollback(ctx))
	}
}

// In a queue of more keys than the walk takes (1,000), a tenant's view
// counts the queue's rows instead, with the same answer: the tenant's keys
// sort after the first thousand, which the walk never reaches.
func TestTenantKeysViewAmongManyKeys(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	db := testsvc.NewDB(t)
	for _, q := range []string{
		`INSERT INTO runs (tenant, id, name, queue, request_hash)
			SELECT 'other', 'r' || g, 'echo', 'q', '\x00' FROM generate_series(1, 1500) g`,
		`INSERT INTO tasks (run_pk, queue, fairness_key) SELECT pk, 'q', 'other/' || id FROM runs WHERE tenant = 'other'`,
		`INSERT INTO runs (tenant, id, name, queue, request_hash)
			SELECT 'zeta', 'a' || g, 'echo', 'q', '\x00' FROM generate_series(1, 3) g`,
		`INSERT INTO tasks (run_pk, queue, fairness_key)
			SELECT pk, 'q', CASE WHEN id = 'a1' THEN 'zeta' ELSE 'zeta/' || id END FROM runs WHERE tenant = 'zeta'`,
	} {
		_, err := db.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	for _, mode := range []string{"auto", "force_generic_plan"} {
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op once rolled back
		_, err = tx.Exec(ctx, `SELECT set_config('plan_cache_mode', $1, true)`, mode)
		require.NoError(t, err)
		view, err := weights.KeysOwned(ctx, tx, "q", "zeta", 0)
		require.NoError(t, err, mode)
		pending := map[string]int{}
		for _, k := range view.Keys {
			pending[k.Key] = k.Pending
		}
		require.Equal(t, map[string]int{"zeta": 1, "zeta/a2": 1, "zeta/a3": 1}, pending, mode)
		require.NoError(t, tx.Rollback(ctx))
	}
}
