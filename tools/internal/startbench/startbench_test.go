package startbench

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

// A short run over both transports, with the gateway's group settings
// overridden, measures starts without errors, prints what it returns and
// drops the database it made.
func TestRunMeasuresBothTransports(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	server := testsvc.ServerURL(t)
	var out, log bytes.Buffer
	results, err := Run(ctx, Config{
		ServerURL: server, NATSURL: testsvc.NATSURL(t),
		Transports: []string{"http", "nats"}, Clients: 3, Tenants: 2, Keys: 2,
		Duration: 300 * time.Millisecond, Flushers: 1, GroupMax: 4, Out: &out, Log: &log,
	})
	require.NoError(t, err)
	require.Len(t, results, 2)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Len(t, lines, 2, "one JSON line per transport")
	for i, r := range results {
		require.Equal(t, []string{"http", "nats"}[i], r.Transport)
		require.Positive(t, r.Starts)
		require.Zero(t, r.Errors)
		require.Equal(t, 2, r.Tenants)
		require.Equal(t, 3, r.Clients)
		require.LessOrEqual(t, r.P50, r.P99)
		var printed Result
		require.NoError(t, json.Unmarshal([]byte(lines[i]), &printed))
		require.Equal(t, r, printed)
	}

	conn, err := pgx.Connect(ctx, server)
	require.NoError(t, err)
	defer conn.Close(ctx)
	m := regexp.MustCompile(`database (harvest_bench_[0-9a-f]+)`).FindStringSubmatch(log.String())
	require.NotNil(t, m, "the log names the database: %s", log.String())
	var left int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_database WHERE datname = $1`, m[1]).Scan(&left))
	require.Zero(t, left, "the bench's database %s is dropped", m[1])
}
