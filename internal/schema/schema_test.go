package schema_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sourcegraph/conc/pool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/schema"
	"github.com/harvest-run/harvest/internal/testsvc"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

func TestMigrationsAreNumberedInOrder(t *testing.T) {
	t.Parallel()
	ms, err := schema.Migrations()
	require.NoError(t, err)
	require.NotEmpty(t, ms)
	for i, m := range ms {
		require.Equal(t, i+1, m.Version, "migration %s", m.Name)
	}
	require.Equal(t, ms[len(ms)-1].Version, schema.Latest())
}

// Several processes starting at once must apply each migration exactly once.
func TestMigrateConcurrentlyIsSafeAndIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := pgxpool.New(ctx, testsvc.NewEmptyDBURL(t))
	require.NoError(t, err)
	t.Cleanup(db.Close)

	g := pool.New().WithErrors()
	versions := make([]int, 6)
	for i := range versions {
		g.Go(func() error {
			v, err := schema.Migrate(ctx, db)
			versions[i] = v
			return err
		})
	}
	require.NoError(t, g.Wait())
	for _, v := range versions {
		require.Equal(t, schema.Latest(), v)
	}
	var applied int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&applied))
	require.Equal(t, schema.Latest(), applied)
}
