package cli

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// Not parallel: it sets HARVEST_* for the CLI through t.Setenv.
func TestAdmissionGetSet(t *testing.T) {
	a, b := testsvc.NewDBURL(t), testsvc.NewDBURL(t)
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	require.NoError(t, os.WriteFile(tokens, []byte(`[
		{"name":"a","tenant":"acme","sha256":"ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb","privileges":["runs:start"]},
		{"name":"g","tenant":"globex","sha256":"cd0aa9856147b6c5b4ff2b7dfee5da20aa38253099ef1b4a64aced233c9afe29","privileges":["runs:start"]},
		{"name":"root","sha256":"454349e422f05297191ead13e21d3db520e5abef52055e4964b82fb213f593a1","privileges":["config:read","config:write"]}
	]`), 0o600))
	env := map[string]string{
		"HARVEST_SHARDS": a + "," + b, "HARVEST_MAX_RUNS": "40",
		"HARVEST_GATEWAY_TOKENS_FILE": tokens, "HARVEST_NATS_URL": testsvc.NATSURL(t),
	}
	ctx := context.Background()
	for url, n := range map[string]int{a: 3, b: 5} {
		conn, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `INSERT INTO tenant_running (tenant, running) VALUES ('acme', $1)`, n)
		require.NoError(t, err)
		require.NoError(t, conn.Close(ctx))
	}

	code, out, errOut := run(t, env, "admission", "get", "--json")
	require.Equal(t, 0, code, errOut)
	var v api.AdmissionView
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.Equal(t, api.AlgorithmNoLimit, v.Algorithm)
	require.Equal(t, 40, v.MaxRuns)
	require.True(t, v.MaxRunsReadOnly)
	require.Equal(t, 2, v.Tenants)
	require.Equal(t, 8, v.RunningTotal)
	require.Equal(t, map[string]int{"acme": 8, "globex": 0}, v.Running)
	require.Nil(t, v.Limit)

	code, out, errOut = run(t, env, "admission", "set", "--algorithm", "static", "--tfm", "0.5", "--json")
	require.Equal(t, 0, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.Equal(t, api.AlgorithmStatic, v.Algorithm)
	require.Equal(t, 10, *v.Limit, "40 × 0.5 / 2 tenants")
	require.Contains(t, v.UpdatedBy, "cli:")

	code, out, errOut = run(t, env, "admission", "get")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "algorithm      static")
	require.Contains(t, out, "read-only")
	require.Contains(t, out, "10 per tenant")

	// Bad usage exits 2; a refused value is audited on shard 0.
	for _, args := range [][]string{
		{"admission"}, {"admission", "frob"}, {"admission", "set"},
		{"admission", "set", "--tfm", "abc"}, {"admission", "set", "--tfm", "-1"},
		{"admission", "set", "--algorithm", "fair"}, {"admission", "get", "extra"},
		{"admission", "set", "--max-runs", "10"},
	} {
		code, _, errOut = run(t, env, args...)
		require.Equal(t, 2, code, "%v: %s", args, errOut)
	}
	conn, err := pgx.Connect(ctx, a)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var refused int
	require.NoError(t, conn.QueryRow(ctx, `SELECT coalesce(sum(1 + repeats), 0) FROM audit WHERE action = $1 AND outcome = 'refused'`, tenantcap.AuditAction).Scan(&refused))
	require.Equal(t, 2, refused, "the negative tfm and the unknown algorithm")
	cur, err := tenantcap.LoadConfig(ctx, conn)
	require.NoError(t, err)
	require.Equal(t, tenantcap.Config{Algorithm: api.AlgorithmStatic, TFM: 0.5}, cur.Config)
}
