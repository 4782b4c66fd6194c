package cli

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/schema"
	"github.com/harvest-run/harvest/internal/testsvc"
)

// run invokes the CLI like a user would, with env set for this call only.
func run(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	var out, errb bytes.Buffer
	code = Main(args, &out, &errb)
	return code, out.String(), errb.String()
}

func tableNames(t *testing.T, url string) []string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// Not parallel: it sets HARVEST_SHARDS for the CLI through t.Setenv.
func TestMigrateTwoShardsTwice(t *testing.T) {
	a, b := testsvc.NewEmptyDBURL(t), testsvc.NewEmptyDBURL(t)
	env := map[string]string{"HARVEST_SHARDS": a + "," + b}

	for pass := 1; pass <= 2; pass++ {
		code, out, errOut := run(t, env, "migrate")
		require.Equal(t, 0, code, "pass %d: stdout=%s stderr=%s", pass, out, errOut)
		want := fmt.Sprintf("version %d", schema.Latest())
		require.Contains(t, out, "shard 0 (")
		require.Contains(t, out, "shard 1 (")
		require.Equal(t, 2, strings.Count(out, want), "pass %d output: %s", pass, out)
	}
	for _, url := range []string{a, b} {
		require.Contains(t, tableNames(t, url), "tasks")
		require.Contains(t, tableNames(t, url), "schema_migrations")
	}
}

func TestMigrateNamesUnreachableShard(t *testing.T) {
	good := testsvc.NewEmptyDBURL(t)
	dead := "postgres://postgres@127.0.0.1:1/nowhere?sslmode=disable&connect_timeout=2"
	env := map[string]string{"HARVEST_SHARDS": dead + "," + good}

	code, out, errOut := run(t, env, "migrate")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "shard 0 (postgres://postgres@127.0.0.1:1/nowhere")
	require.Contains(t, out, "shard 0 (postgres://postgres@127.0.0.1:1/nowhere")
	require.Contains(t, out, "FAILED")
	// The reachable shard was still migrated.
	require.Contains(t, out, fmt.Sprintf("shard 1 (%s): version %d", good, schema.Latest()))
	require.Contains(t, tableNames(t, good), "runs")
}

func TestMigrateRefusesBadShardList(t *testing.T) {
	code, _, errOut := run(t, map[string]string{"HARVEST_SHARDS": "mysql://x"}, "migrate")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "HARVEST_SHARDS")

	code, _, errOut = run(t, map[string]string{"HARVEST_SHARDS": ""}, "migrate")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "HARVEST_SHARDS")
}

func TestUnknownCommandIsUsageError(t *testing.T) {
	t.Parallel()
	var out, errb bytes.Buffer
	require.Equal(t, 2, Main([]string{"frobnicate"}, &out, &errb))
	require.Contains(t, errb.String(), `unknown command "frobnicate"`)
}
