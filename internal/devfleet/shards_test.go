package devfleet

import (
	"context"
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/internal/testsvc"
)

// A fleet of three shards makes three migrated databases, prints them
// in HARVEST_SHARDS, gives each tenant its rendezvous home among three,
// comes up (a worker per shard claims), and drops them when it stops.
func TestRunMakesTheShardsAskedFor(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a whole dev fleet")
	}
	t.Parallel()
	admin := testsvc.ServerURL(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var got *Fleet
	err := Run(ctx, Options{DatabaseURL: admin, HTTPAddr: "127.0.0.1:0", NATSPort: freePort(t), Shards: 3},
		func(f *Fleet) {
			got = f
			cancel()
		})
	require.NoError(t, err)
	require.NotNil(t, got, "the fleet never came up")
	require.Len(t, got.Shards, 3)

	var env string
	for _, l := range got.EnvLines() {
		if v, ok := strings.CutPrefix(l, "HARVEST_SHARDS="); ok {
			env = v
		}
	}
	require.Equal(t, strings.Join(got.Shards, ","), env)
	for _, tn := range got.Tenants {
		require.Equal(t, shards.Home(tn.Name, 3), tn.Shard, tn.Name)
	}
	require.Equal(t, got.Tenants[0].Shard, got.Tenants[1].Shard, "tenants 1 and 2 share a home")

	conn, err := pgx.Connect(t.Context(), admin)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	for _, s := range got.Shards {
		u, err := url.Parse(s)
		require.NoError(t, err)
		var n int
		require.NoError(t, conn.QueryRow(t.Context(), "SELECT count(*) FROM pg_database WHERE datname = $1",
			strings.TrimPrefix(u.Path, "/")).Scan(&n))
		require.Zero(t, n, "database %s left behind", u.Path)
	}
}

// More shards than the server's max_connections can hold are refused
// before any database is made.
func TestRunRefusesShardsBeyondTheServer(t *testing.T) {
	t.Parallel()
	admin := testsvc.ServerURL(t)
	conn, err := pgx.Connect(t.Context(), admin)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var limit int
	require.NoError(t, conn.QueryRow(t.Context(), "SELECT current_setting('max_connections')::int").Scan(&limit))
	n := max(limit/connectionsPerShard+1, DefaultShards+1)
	if n > MaxShards {
		t.Skipf("the server takes %d connections, enough for %d shards", limit, MaxShards)
	}
	err = Run(t.Context(), Options{DatabaseURL: admin, HTTPAddr: "127.0.0.1:0", NATSPort: freePort(t), Shards: n}, nil)
	require.ErrorContains(t, err, "max_connections")
	require.ErrorContains(t, err, "--shards")

	err = Run(t.Context(), Options{DatabaseURL: admin, Shards: MaxShards + 1}, nil)
	require.ErrorContains(t, err, "--shards")
}

// freePort returns a port nothing listens on just now.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
