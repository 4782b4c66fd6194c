package workerbin

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
)

// The worker warns at start when its pool may open more connections than
// the shard's server accepts, and only then.
func TestWarnsWhenThePoolMayOutgrowTheServer(t *testing.T) {
	t.Parallel()
	base := testsvc.NewDB(t)
	var accepts int
	require.NoError(t, base.QueryRow(t.Context(), sqlConnectionLimit).Scan(&accepts))
	warned := func(maxConns int32) string {
		cfg, err := pgxpool.ParseConfig(base.Config().ConnString())
		require.NoError(t, err)
		cfg.MaxConns = maxConns
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		require.NoError(t, err)
		defer pool.Close()
		var out bytes.Buffer
		warnConnectionLimit(t.Context(), slog.New(slog.NewTextHandler(&out, nil)), pool, 3)
		return out.String()
	}
	require.Empty(t, warned(int32(accepts)), "a pool the server can hold whole")
	msg := warned(int32(accepts) + 1)
	require.Contains(t, msg, "level=WARN")
	require.Contains(t, msg, "HARVEST_WORKER_MAX_CONCURRENT_CLAIMS")
	require.Contains(t, msg, "shard=3")
	require.Contains(t, msg, "server_accepts=")
}
