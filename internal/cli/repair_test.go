package cli

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/claim"
)

// Rows written past the arrival trigger (a bulk load with it disabled) are
// invisible to the fair claim's key heads until a repair: the command
// finds the key on the shard that has it and reports it on each shard.
// Not parallel: it sets HARVEST_SHARDS for the CLI through t.Setenv.
func TestRepairRebuildsHeadsOnEveryShard(t *testing.T) {
	ctx := context.Background()
	urls := []string{testsvc.NewDBURL(t), testsvc.NewDBURL(t)}
	conn, err := pgx.Connect(ctx, urls[1])
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, s := range []string{
		`INSERT INTO runs (tenant, id, name, queue, request_hash) VALUES ('t', 'a', 'wf', 'q', '\x00'), ('t', 'b', 'wf', 'q', '\x00')`,
		`INSERT INTO tasks (run_pk, queue, fairness_key) SELECT pk, 'q', 'seen' FROM runs WHERE id = 'a'`,
		`ALTER TABLE tasks DISABLE TRIGGER tasks_arrive_insert`,
		`INSERT INTO tasks (run_pk, queue, fairness_key) SELECT pk, 'q', 'unseen' FROM runs WHERE id = 'b'`,
		`ALTER TABLE tasks ENABLE TRIGGER tasks_arrive_insert`,
	} {
		_, err := conn.Exec(ctx, s)
		require.NoError(t, err, s)
	}

	code, out, errOut := run(t, map[string]string{"HARVEST_SHARDS": strings.Join(urls, ",")}, "repair", "--json")
	require.Equal(t, 0, code, "stdout=%s stderr=%s", out, errOut)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2)
	var shard1 repairResult
	require.NoError(t, json.Unmarshal([]byte(lines[1]), &shard1))
	require.Equal(t, []claim.Repaired{{Queue: "q", Repaired: 1}}, shard1.Queues,
		"the key written past the trigger got its head from the task rows (the other one came with its arrival)")
	var shard0 repairResult
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &shard0))
	require.Empty(t, shard0.Queues)

	// Both keys are served now, one claim each.
	seen := map[string]bool{}
	for range 2 {
		r, err := claim.Claim(ctx, conn, claim.Request{Queue: "q", Fair: true})
		require.NoError(t, err)
		require.True(t, r.OK)
		seen[r.Task.Key] = true
	}
	require.Equal(t, map[string]bool{"seen": true, "unseen": true}, seen)

	code, out, _ = run(t, map[string]string{"HARVEST_SHARDS": strings.Join(urls, ",")}, "repair")
	require.Equal(t, 0, code)
	require.Contains(t, out, "shard 1: 1 queues, 0 key heads repaired")
}
