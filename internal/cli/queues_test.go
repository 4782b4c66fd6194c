package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

// Not parallel: the commands read HARVEST_SHARDS through t.Setenv.
func TestQueuesPauseAndResume(t *testing.T) {
	a, b := testsvc.NewDBURL(t), testsvc.NewDBURL(t)
	both := map[string]string{"HARVEST_SHARDS": a + "," + b, "HARVEST_NATS_URL": "nats://127.0.0.1:1"}
	partial := map[string]string{"HARVEST_SHARDS": a + "," + deadShard, "HARVEST_NATS_URL": "nats://127.0.0.1:1"}

	code, out, errOut := run(t, both, "queues", "pause", "--queue", "orders")
	require.Equal(t, 0, code, "stdout=%s stderr=%s", out, errOut)
	require.Contains(t, out, `queue "orders" paused`)
	require.Contains(t, out, "paused by cli:")

	code, out, _ = run(t, both, "weights", "keys", "--queue", "orders")
	require.Equal(t, 0, code)
	require.Contains(t, out, "PAUSED by cli:")

	code, out, _ = run(t, partial, "queues", "resume", "--queue", "orders", "--json")
	require.Equal(t, 3, code, "shard 1 is down: send it again")
	var res api.QueuePauseResult
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, []int{1}, res.UnavailableShards)
	require.True(t, res.Shards[0].Changed)

	code, out, _ = run(t, both, "queues", "resume", "--queue", "orders")
	require.Equal(t, 0, code)
	require.Contains(t, out, "unchanged", "shard 0 was resumed already")
	code, out, _ = run(t, both, "weights", "keys", "--queue", "orders")
	require.Equal(t, 0, code)
	require.NotContains(t, out, "PAUSED")

	code, _, errOut = run(t, both, "queues", "pause")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--queue is required")
	code, _, errOut = run(t, both, "queues", "stop", "--queue", "orders")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "want pause, resume, fairness or group-weight")
}

// Not parallel: the commands read HARVEST_SHARDS through t.Setenv.
func TestQueuesFairness(t *testing.T) {
	a, b := testsvc.NewDBURL(t), testsvc.NewDBURL(t)
	both := map[string]string{"HARVEST_SHARDS": a + "," + b}
	partial := map[string]string{"HARVEST_SHARDS": a + "," + deadShard}

	code, out, errOut := run(t, both, "queues", "fairness", "--queue", "orders")
	require.Equal(t, 0, code, "stdout=%s stderr=%s", out, errOut)
	require.Regexp(t, `1\s+ok\s+false\s+claims\s+-`, out)

	code, out, errOut = run(t, both, "queues", "fairness", "--queue", "orders", "--two-level=true", "--charge", "runtime")
	require.Equal(t, 0, code, "stdout=%s stderr=%s", out, errOut)
	require.Regexp(t, `1\s+ok\s+true\s+runtime\s+cli:`, out)

	code, out, _ = run(t, partial, "queues", "fairness", "--queue", "orders", "--charge", "claims", "--json")
	require.Equal(t, 3, code, "shard 1 is down: send it again")
	var res api.QueueFairnessResult
	require.NoError(t, json.Unmarshal([]byte(out), &res))
	require.Equal(t, []int{1}, res.UnavailableShards)
	require.True(t, res.Shards[0].Changed)
	require.True(t, res.Shards[0].Fairness.TwoLevel, "two-level kept")

	// Group weights: set on every shard, listed by a read, cleared; a
	// partial write exits 3.
	code, out, errOut = run(t, both, "queues", "group-weight", "--queue", "orders", "--group", "acme", "--weight", "3")
	require.Equal(t, 0, code, "stdout=%s stderr=%s", out, errOut)
	require.Contains(t, out, `group "acme" of queue "orders": weight set to 3`)
	require.Regexp(t, `0\s+ok\s+-`, out)
	code, out, errOut = run(t, both, "queues", "group-weight", "--queue", "orders", "--group", "globex", "--weight", "0.5")
	require.Equal(t, 0, code, "stdout=%s stderr=%s", out, errOut)
	code, out, _ = run(t, both, "queues", "fairness", "--queue", "orders")
	require.Equal(t, 0, code)
	require.Contains(t, out, "group weights: acme=3 globex=0.5\n")
	code, out, errOut = run(t, both, "queues", "group-weight", "--queue", "orders", "--group", "acme", "--clear")
	require.Equal(t, 0, code, "stdout=%s stderr=%s", out, errOut)
	require.Regexp(t, `1\s+ok\s+3\s`, out, "the old weight")
	code, _, _ = run(t, partial, "queues", "group-weight", "--queue", "orders", "--group", "globex", "--clear")
	require.Equal(t, 3, code)
	code, out, _ = run(t, both, "queues", "fairness", "--queue", "orders")
	require.Equal(t, 0, code)
	require.Contains(t, out, "group weights on shards 0: none (every group weighs 1)\n")
	require.Contains(t, out, "group weights on shards 1: globex=0.5\n")
	for args, want := range map[string]string{
		"--group acme":                    "--weight W or --clear",
		"--group acme --weight 2 --clear": "--weight W or --clear",
		"--weight 2":                      "--group is required",
		"--group acme/k1 --weight 2":      "group",
		"--group acme --weight -1":        "weight",
	} {
		code, _, errOut = run(t, both, append([]string{"queues", "group-weight", "--queue", "orders"}, strings.Fields(args)...)...)
		require.Equal(t, 2, code, args)
		require.Contains(t, errOut, want, args)
	}

	code, _, errOut = run(t, both, "queues", "fairness", "--queue", "orders", "--charge", "seconds")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "charge")
	code, _, errOut = run(t, both, "queues", "fairness", "--queue", "orders", "--two-level", "maybe")
	require.Equal(t, 2, code)
	require.Contains(t, errOut, "--two-level")
}
