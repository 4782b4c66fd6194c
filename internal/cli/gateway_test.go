package cli

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/testsvc"
)

// serveGateway runs an in-process gateway over shards and returns its URL.
// Its token "root-secret" (name root) may read and write weights and the
// admission configuration.
func serveGateway(t *testing.T, shards ...string) string {
	t.Helper()
	set, err := auth.ParseTokens([]byte(`[{"name": "root", "sha256": "` + auth.HashSecret("root-secret") +
		`", "privileges": ["weights:read", "weights:write", "config:read", "config:write"]}]`))
	require.NoError(t, err)
	cfg := gateway.DefaultConfig(shards, "nats://127.0.0.1:1")
	cfg.ConnectTimeout = time.Second
	g, err := gateway.New(gateway.Options{Config: cfg, Tokens: auth.NewStore(set),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(func() {
		srv.Close()
		g.Close()
	})
	return srv.URL
}

// With HARVEST_GATEWAY_URL and HARVEST_TOKEN the weights, quotas and
// admission commands go through the gateway with the same output and exit
// codes as the direct path. Not parallel: t.Setenv.
func TestCommandsThroughGateway(t *testing.T) {
	a, b := testsvc.NewDBURL(t), testsvc.NewDBURL(t)
	direct := map[string]string{"HARVEST_SHARDS": a + "," + b, "HARVEST_NATS_URL": "nats://127.0.0.1:1", "HARVEST_GATEWAY_URL": ""}
	gw := map[string]string{"HARVEST_SHARDS": "", "HARVEST_GATEWAY_URL": serveGateway(t, a, b), "HARVEST_TOKEN": "root-secret"}
	partial := map[string]string{"HARVEST_SHARDS": "", "HARVEST_GATEWAY_URL": serveGateway(t, a, deadShard), "HARVEST_TOKEN": "root-secret"}

	// weights: the same output both ways, exit 0; 3 with a shard down.
	code, viaDirect, errOut := run(t, direct, "weights", "set", "--queue", "orders.eu", "--key", "vip", "--weight", "4")
	require.Equal(t, 0, code, errOut)
	code, viaGateway, errOut := run(t, gw, "weights", "set", "--queue", "orders.eu", "--key", "vip", "--weight", "4")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, viaDirect, viaGateway)
	require.Contains(t, viaGateway, "on all 2 shards")
	code, viaGateway, _ = run(t, partial, "weights", "set", "--queue", "orders.eu", "--key", "new", "--weight", "2")
	require.Equal(t, 3, code, viaGateway)
	require.Contains(t, viaGateway, "unavailable")
	code, viaGateway, _ = run(t, gw, "weights", "get", "--queue", "orders.eu")
	require.Equal(t, 0, code)
	require.Contains(t, viaGateway, "DISAGREE", "shard 1 missed the partial write")

	// The audit rows name the token, not the operating-system user.
	var actor string
	conn, err := pgx.Connect(t.Context(), a)
	require.NoError(t, err)
	defer conn.Close(t.Context())
	require.NoError(t, conn.QueryRow(t.Context(), `SELECT actor FROM audit ORDER BY id DESC LIMIT 1`).Scan(&actor))
	require.Equal(t, "root", actor)

	// quotas: same output both ways.
	code, _, errOut = run(t, gw, "quotas", "set", "--queue", "orders.eu", "--quota-key", "acme", "--max-concurrent", "2")
	require.Equal(t, 0, code, errOut)
	code, viaDirect, _ = run(t, direct, "quotas", "get", "--queue", "orders.eu", "--quota-key", "acme")
	require.Equal(t, 0, code)
	code, viaGateway, _ = run(t, gw, "quotas", "get", "--queue", "orders.eu", "--quota-key", "acme")
	require.Equal(t, 0, code)
	require.Equal(t, viaDirect, viaGateway)
	require.Contains(t, viaGateway, "MAX CONCURRENT")

	// admission: set and get through the gateway; a bad value is a usage
	// error naming the flag, as on the direct path.
	code, out, errOut := run(t, gw, "admission", "set", "--algorithm", "static", "--tfm", "2")
	require.Equal(t, 0, code, errOut)
	require.Equal(t, "admission set: algorithm static, tfm 2 (by root)\n", out)
	code, _, errOut = run(t, gw, "admission", "set", "--tfm", "-1")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--tfm: tfm must be a positive finite number")
	code, out, _ = run(t, gw, "admission", "get")
	require.Equal(t, 0, code)
	require.Contains(t, out, "algorithm      static")
	require.Contains(t, out, "tfm            2")

	// A gateway URL without a token is a usage error.
	code, _, errOut = run(t, map[string]string{"HARVEST_GATEWAY_URL": gw["HARVEST_GATEWAY_URL"], "HARVEST_TOKEN": ""}, "weights", "get", "--queue", "q")
	require.Equal(t, 2, code)
	require.True(t, strings.Contains(errOut, "HARVEST_TOKEN"), errOut)
}
