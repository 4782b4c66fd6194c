package cli

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

const deadShard = "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=1"

func execOn(t *testing.T, url, sql string, args ...any) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql, args...)
	require.NoError(t, err)
}

// Not parallel: the commands read HARVEST_SHARDS through t.Setenv.
func TestWeightsCommandExitCodes(t *testing.T) {
	a, b := testsvc.NewDBURL(t), testsvc.NewDBURL(t)
	both := map[string]string{"HARVEST_SHARDS": a + "," + b, "HARVEST_NATS_URL": "nats://127.0.0.1:1"}
	partial := map[string]string{"HARVEST_SHARDS": a + "," + deadShard, "HARVEST_NATS_URL": "nats://127.0.0.1:1"}
	none := map[string]string{"HARVEST_SHARDS": deadShard, "HARVEST_NATS_URL": "nats://127.0.0.1:1"}

	code, out, errOut := run(t, both, "weights", "set", "--queue", "shared", "--key", "tenant-42", "--weight", "4")
	require.Equal(t, 0, code, "stdout=%s stderr=%s", out, errOut)
	require.Contains(t, out, "OUTCOME")
	require.Contains(t, out, "on all 2 shards")

	code, out, _ = run(t, partial, "weights", "set", "--queue", "shared", "--key", "tenant-7", "--weight", "2", "--json")
	require.Equal(t, 3, code)
	var wr api.WeightWriteResult
	require.NoError(t, json.Unmarshal([]byte(out), &wr))
	require.Equal(t, "ok", wr.Shards[0].Outcome)
	require.Equal(t, "unavailable", wr.Shards[1].Outcome)

	code, out, _ = run(t, both, "weights", "get", "--queue", "shared", "--json")
	require.Equal(t, 0, code)
	var rr api.WeightReadResult
	require.NoError(t, json.Unmarshal([]byte(out), &rr))
	require.False(t, rr.WeightsUniform, "shard 1 missed tenant-7")
	code, out, _ = run(t, both, "weights", "get", "--queue", "shared")
	require.Equal(t, 0, code)
	require.Contains(t, out, "DISAGREE")
	require.Contains(t, out, `"tenant-7"`)

	code, _, _ = run(t, partial, "weights", "get", "--queue", "shared")
	require.Equal(t, 3, code, "a read with a shard down")

	// Send it again with every shard up: it converges.
	code, _, _ = run(t, both, "weights", "set", "--queue", "shared", "--key", "tenant-7", "--weight", "2")
	require.Equal(t, 0, code)
	code, out, _ = run(t, both, "weights", "get", "--queue", "shared", "--json")
	require.Equal(t, 0, code)
	rr = api.WeightReadResult{}
	require.NoError(t, json.Unmarshal([]byte(out), &rr))
	require.True(t, rr.WeightsUniform)
	require.Len(t, rr.Overrides, 2)

	code, _, errOut = run(t, none, "weights", "set", "--queue", "shared", "--key", "k", "--weight", "2")
	require.Equal(t, 5, code, errOut)
	code, _, _ = run(t, none, "weights", "get", "--queue", "shared")
	require.Equal(t, 5, code)

	// Shard 1 at the cap: 4, and the refusal is audited there.
	execOn(t, b, `INSERT INTO weight_overrides (queue, key, weight)
		SELECT 'full', 'k' || i, 2 FROM generate_series(1, 1000) i`)
	code, out, errOut = run(t, both, "weights", "set", "--queue", "full", "--key", "one-more", "--weight", "2")
	require.Equal(t, 4, code, "stdout=%s stderr=%s", out, errOut)
	require.Contains(t, out, "cap_reached")
	require.Contains(t, errOut, "clear an override on that shard first")

	code, out, _ = run(t, both, "weights", "clear", "--queue", "shared", "--key", "tenant-7")
	require.Equal(t, 0, code, out)

	code, out, _ = run(t, both, "weights", "keys", "--queue", "shared")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, `"tenant-42"`)
	require.Contains(t, out, "CLAIMS/MIN")

	// Bad usage: 2, before any shard is touched.
	for _, args := range [][]string{
		{"weights"},
		{"weights", "frob", "--queue", "q"},
		{"weights", "set", "--key", "k", "--weight", "2"},
		{"weights", "set", "--queue", "q", "--weight", "2"},
		{"weights", "set", "--queue", "q", "--key", "k"},
		{"weights", "set", "--queue", "q", "--key", "k", "--weight", "0"},
		{"weights", "set", "--queue", "q", "--key", "k", "--weight", "1001"},
		{"weights", "set", "--queue", " q", "--key", "k", "--weight", "2"},
		{"weights", "set", "--queue", "q", "--key", "", "--weight", "2"},
		{"weights", "clear", "--queue", "q", "--key", ".."},
		{"weights", "get", "--queue", "q", "--bogus"},
	} {
		code, _, errOut := run(t, none, args...)
		require.Equal(t, 2, code, "%v: %s", args, errOut)
	}

	// Audit rows carry the CLI's actor.
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, b)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var actor, outcome string
	require.NoError(t, conn.QueryRow(ctx, `SELECT actor, outcome FROM audit WHERE key = 'one-more'`).Scan(&actor, &outcome))
	require.Equal(t, cliActor(), actor)
	require.Regexp(t, `^cli:.+`, actor)
	require.Equal(t, "refused", outcome)
}

func TestQuotasCommand(t *testing.T) {
	a, b := testsvc.NewDBURL(t), testsvc.NewDBURL(t)
	both := map[string]string{"HARVEST_SHARDS": a + "," + b, "HARVEST_NATS_URL": "nats://127.0.0.1:1"}
	partial := map[string]string{"HARVEST_SHARDS": deadShard + "," + b, "HARVEST_NATS_URL": "nats://127.0.0.1:1"}

	code, out, errOut := run(t, both, "quotas", "set", "--queue", "jobs", "--quota-key", "acme", "--max-concurrent", "3", "--rate", "5", "--burst", "10")
	require.Equal(t, 0, code, "stdout=%s stderr=%s", out, errOut)
	code, out, _ = run(t, both, "quotas", "get", "--queue", "jobs", "--json")
	require.Equal(t, 0, code)
	var qr api.QuotaReadResult
	require.NoError(t, json.Unmarshal([]byte(out), &qr))
	require.True(t, qr.QuotasUniform)
	require.Len(t, qr.Quotas, 1)
	require.Equal(t, 3, *qr.Quotas[0].MaxConcurrent)
	require.Equal(t, 5.0, *qr.Quotas[0].Rate)

	code, out, _ = run(t, partial, "quotas", "set", "--queue", "jobs", "--quota-key", "acme", "--max-concurrent", "4", "--json")
	require.Equal(t, 3, code, out)
	var wr api.QuotaWriteResult
	require.NoError(t, json.Unmarshal([]byte(out), &wr))
	require.Equal(t, []api.ShardOutcome{wr.Shards[0], {Shard: 1, Outcome: "ok", Message: ""}}, wr.Shards)
	require.Equal(t, "unavailable", wr.Shards[0].Outcome)

	code, out, _ = run(t, both, "quotas", "get", "--queue", "jobs", "--quota-key", "acme")
	require.Equal(t, 0, code)
	require.Contains(t, out, "DISAGREE")

	code, _, _ = run(t, both, "quotas", "clear", "--queue", "jobs", "--quota-key", "acme")
	require.Equal(t, 0, code)

	for _, args := range [][]string{
		{"quotas", "set", "--queue", "jobs", "--quota-key", "acme"},
		{"quotas", "set", "--queue", "jobs", "--quota-key", "acme", "--rate", "5"},
		{"quotas", "set", "--queue", "jobs", "--quota-key", "acme", "--max-concurrent", "0"},
		{"quotas", "set", "--queue", "jobs", "--max-concurrent", "2"},
		{"quotas", "clear", "--queue", "jobs"},
	} {
		code, _, errOut := run(t, both, args...)
		require.Equal(t, 2, code, "%v: %s", args, errOut)
	}
}

// HARVEST_GATEWAY_URL takes the command to the gateway (see
// TestCommandsThroughGateway): without HARVEST_TOKEN it is a usage error,
// and a gateway that does not answer is an error (exit 1).
func TestGatewaySeam(t *testing.T) {
	env := map[string]string{"HARVEST_SHARDS": deadShard, "HARVEST_GATEWAY_URL": "http://127.0.0.1:1", "HARVEST_TOKEN": ""}
	code, _, errOut := run(t, env, "weights", "get", "--queue", "q")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "HARVEST_GATEWAY_URL")
	env["HARVEST_TOKEN"] = "secret"
	code, _, errOut = run(t, env, "weights", "get", "--queue", "q")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "127.0.0.1:1")
}
