package schema_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
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

// Every SQL function and trigger of the repository is defined in one file
// only: a second definition elsewhere would silently win or lose depending
// on the order the files load.
func TestEachFunctionAndTriggerIsDefinedOnce(t *testing.T) {
	t.Parallel()
	def := regexp.MustCompile(`(?i)CREATE\s+(?:OR\s+REPLACE\s+)?(FUNCTION|TRIGGER|PROCEDURE)\s+([a-z_0-9]+)`)
	where := map[string]string{}
	files := 0
	require.NoError(t, filepath.WalkDir("../..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".sql") {
			return nil
		}
		files++
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range def.FindAllStringSubmatch(string(b), -1) {
			name := strings.ToLower(m[1]) + " " + strings.ToLower(m[2])
			if prev, ok := where[name]; ok {
				t.Errorf("%s is defined in %s and in %s", name, prev, path)
			}
			where[name] = path
		}
		return nil
	}))
	require.Greater(t, files, 50, "the SQL files were found")
	require.Greater(t, len(where), 30, "the definitions were found")
}
