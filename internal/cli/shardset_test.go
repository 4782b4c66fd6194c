package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
)

// Every command reaches the shards one way (shardSet, eachShard), so a
// shard that is down is an answer of its own in each of them: admission
// get lists it under unavailable_shards as GET /v1/admission does, and
// counts the others; repair reports it FAILED, naming its URL, repairs the
// others and exits 1.
// Not parallel: it sets HARVEST_* for the CLI through t.Setenv.
func TestAShardThatIsDownIsOneAnswer(t *testing.T) {
	good := testsvc.NewDBURL(t)
	env := map[string]string{"HARVEST_SHARDS": good + "," + deadShard, "HARVEST_NATS_URL": "nats://127.0.0.1:1", "HARVEST_GATEWAY_URL": ""}

	code, out, errOut := run(t, env, "admission", "get", "--json")
	require.Equal(t, 0, code, "stdout=%s stderr=%s", out, errOut)
	var v api.AdmissionView
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.Equal(t, []int{1}, v.UnavailableShards)
	code, out, errOut = run(t, env, "admission", "get")
	require.Equal(t, 0, code, "stdout=%s stderr=%s", out, errOut)
	require.Contains(t, out, "unavailable    shards [1]")

	code, out, _ = run(t, env, "repair")
	require.Equal(t, 1, code)
	require.Contains(t, out, "shard 0: 0 queues")
	require.Contains(t, out, "shard 1: FAILED: connect postgres://postgres@127.0.0.1:1/x")

	code, out, _ = run(t, env, "repair", "--json")
	require.Equal(t, 1, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	var down repairResult
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &down))
	require.Equal(t, 1, down.Shard)
	require.Contains(t, down.Error, "127.0.0.1:1")
	require.Equal(t, []claim.Repaired{}, down.Queues)
}
