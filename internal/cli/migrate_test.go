package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/config"
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

	// The dead shard is retried until the timeout, so keep it short.
	code, out, errOut := run(t, env, "migrate", "-timeout", "2s")
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

// A shard where nothing listens is retried, each failure logged, until the
// timeout; the error then names the shard.
func TestMigrateRetriesUntilTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := fmt.Sprintf("postgres://postgres@%s/nowhere?sslmode=disable", ln.Addr())
	require.NoError(t, ln.Close()) // now nothing listens there
	code, out, errOut := run(t, map[string]string{"HARVEST_SHARDS": dead}, "migrate", "-timeout", "1500ms")
	require.Equal(t, 1, code)
	require.Contains(t, out, "shard 0 (postgres://postgres@"+ln.Addr().String()+"/nowhere")
	require.Contains(t, out, "FAILED")
	require.Contains(t, errOut, "attempt 2:", "retried: %s", errOut)
	require.Contains(t, errOut, "1 of 1 shards not migrated")
}

// lockedBuffer is a bytes.Buffer the command writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// A shard whose database appears after the command started is migrated
// once it does: the command keeps trying instead of failing at once.
func TestMigrateWaitsForLateShard(t *testing.T) {
	admin := testsvc.ServerURL(t)
	name := testsvc.RandomName("late")
	u, err := url.Parse(admin)
	require.NoError(t, err, "testsvc URL")
	u.Path = "/" + name
	late := u.String()
	t.Setenv("HARVEST_SHARDS", late)

	var out, errb lockedBuffer
	done := make(chan int, 1)
	go func() { done <- Main([]string{"migrate", "-timeout", "60s"}, &out, &errb) }()
	// The first attempt fails: the database does not exist yet.
	require.Eventually(t, func() bool { return strings.Contains(errb.String(), "attempt 1:") },
		20*time.Second, 20*time.Millisecond)

	conn, err := pgx.Connect(t.Context(), admin)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	_, err = conn.Exec(t.Context(), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), admin)
		if err != nil {
			return
		}
		defer func() { _ = c.Close(context.Background()) }()
		_, _ = c.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})

	select {
	case code := <-done:
		require.Equal(t, 0, code, "stdout: %s\nstderr: %s", out.String(), errb.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("migrate did not finish: %s", errb.String())
	}
	require.Contains(t, out.String(), fmt.Sprintf("shard 0 (%s): version %d", config.Redact(late), schema.Latest()))
	require.Contains(t, tableNames(t, late), "runs")
}

// Not parallel: it sets HARVEST_SHARDS for the CLI through t.Setenv.
// migrate status shows every migration pending on a fresh shard and
// applied after migrate, and changes nothing itself.
func TestMigrateStatus(t *testing.T) {
	a := testsvc.NewEmptyDBURL(t)
	env := map[string]string{"HARVEST_SHARDS": a}

	code, out, errOut := run(t, env, "migrate", "status")
	require.Equal(t, 0, code, "stdout=%s stderr=%s", out, errOut)
	require.Contains(t, out, fmt.Sprintf("shard 0 (%s): 0 applied, %d pending", a, schema.Latest()))
	require.Contains(t, out, "0001 ")
	require.NotContains(t, tableNames(t, a), "schema_migrations", "status must not migrate")

	code, out, errOut = run(t, env, "migrate")
	require.Equal(t, 0, code, "stdout=%s stderr=%s", out, errOut)

	code, out, errOut = run(t, env, "migrate", "status", "--json")
	require.Equal(t, 0, code, "stdout=%s stderr=%s", out, errOut)
	var got []shardStatus
	require.NoError(t, json.Unmarshal([]byte(out), &got))
	require.Len(t, got, 1)
	require.Zero(t, got[0].Pending)
	require.Len(t, got[0].Migrations, schema.Latest())
	for _, m := range got[0].Migrations {
		require.True(t, m.Applied, "migration %d", m.Version)
		require.False(t, m.AppliedAt.IsZero())
	}

	dead := "postgres://postgres@127.0.0.1:1/nowhere?sslmode=disable&connect_timeout=2"
	code, out, _ = run(t, map[string]string{"HARVEST_SHARDS": dead}, "migrate", "status", "--timeout", "2s")
	require.Equal(t, 1, code)
	require.Contains(t, out, "shard 0 (postgres://postgres@127.0.0.1:1/nowhere")
	require.Contains(t, out, "FAILED")
}
