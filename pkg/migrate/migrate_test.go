package migrate_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/migrate"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

// A fresh database has every migration pending; Up applies them all (and
// changes nothing when run again), after which Status has them applied.
func TestUpAndStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, testsvc.NewEmptyDBURL(t))
	require.NoError(t, err)
	defer pool.Close()

	before, err := migrate.Status(ctx, pool)
	require.NoError(t, err)
	require.NotEmpty(t, before)
	require.Equal(t, migrate.Latest(), before[len(before)-1].Version)
	for _, m := range before {
		require.False(t, m.Applied, "version %d on a fresh database", m.Version)
	}

	require.NoError(t, migrate.Up(ctx, pool))
	require.NoError(t, migrate.Up(ctx, pool), "a second Up changes nothing")
	after, err := migrate.Status(ctx, pool)
	require.NoError(t, err)
	require.Len(t, after, len(before))
	for _, m := range after {
		require.True(t, m.Applied, "version %d after Up", m.Version)
		require.False(t, m.AppliedAt.IsZero())
	}
	// The schema is usable: the claim's entry point exists.
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_proc WHERE proname = 'harvest_claim_batch'`).Scan(&n))
	require.Equal(t, 1, n)
}
