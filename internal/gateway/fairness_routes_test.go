package gateway

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
)

func TestFairnessRoutes(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})

	// Unset: one level, charged per claim, on both shards.
	status, body := b.call(t, http.MethodGet, "/v1/queues/fq/fairness", secretRoot, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	var got api.QueueFairnessResult
	require.NoError(t, json.Unmarshal(body, &got))
	require.Len(t, got.Shards, 2)
	for _, s := range got.Shards {
		require.Equal(t, api.QueueFairness{Charge: api.ChargeClaims}, s.Fairness)
	}

	// A tenant's token may not change how a queue is shared, whatever its
	// privileges; a reading token may not write.
	for _, secret := range []string{secretA, secretAOps, secretWRead} {
		status, body := b.call(t, http.MethodPut, "/v1/queues/fq/fairness", secret, `{"two_level": true}`)
		require.Equal(t, http.StatusForbidden, status, "%s", body)
		status, body = b.call(t, http.MethodPut, "/v1/queues/fq/group-weights/acme", secret, `{"weight": 2}`)
		require.Equal(t, http.StatusForbidden, status, "%s", body)
	}

	// Bad input names its field and writes nothing.
	for body, field := range map[string]string{
		`{"charge": "time"}`:            "charge",
		`{"two_level": "yes"}`:          "two_level",
		`{}`:                            "two_level",
		`{"two_level": true, "x": 1}`:   "x",
		`{"charge": "runtime"} {"a":1}`: "",
	} {
		status, out := b.call(t, http.MethodPut, "/v1/queues/fq/fairness", secretRoot, body)
		require.Equal(t, http.StatusBadRequest, status, "%s: %s", body, out)
		if field != "" {
			require.Contains(t, string(out), field, "%s", body)
		}
	}
	status, body = b.call(t, http.MethodPut, "/v1/queues/fq/group-weights/acme%2Fk1", secretRoot, `{"weight": 2}`)
	require.Equal(t, http.StatusBadRequest, status, "a group holds no slash: %s", body)
	status, body = b.call(t, http.MethodPut, "/v1/queues/fq/group-weights/acme", secretRoot, `{"weight": 0}`)
	require.Equal(t, http.StatusBadRequest, status, "%s", body)
	var n int
	require.NoError(t, b.dbs[0].QueryRow(b.ctx, `SELECT count(*) FROM queue_fairness`).Scan(&n))
	require.Zero(t, n, "a refused change wrote nothing")

	// Set both modes, then only the charge: the other mode is kept.
	status, body = b.call(t, http.MethodPut, "/v1/queues/fq/fairness", secretRoot, `{"two_level": true, "charge": "runtime"}`)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.NoError(t, json.Unmarshal(body, &got))
	for _, s := range got.Shards {
		require.True(t, s.Changed)
		require.True(t, s.Fairness.TwoLevel)
		require.Equal(t, api.ChargeRuntime, s.Fairness.Charge)
		require.Equal(t, "root", s.Fairness.UpdatedBy)
	}
	status, body = b.call(t, http.MethodPut, "/v1/queues/fq/fairness", secretRoot, `{"charge": "claims"}`)
	require.Equal(t, http.StatusOK, status, "%s", body)
	status, body = b.call(t, http.MethodGet, "/v1/queues/fq/fairness", secretRoot, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	require.NoError(t, json.Unmarshal(body, &got))
	for _, s := range got.Shards {
		require.True(t, s.Fairness.TwoLevel, "two_level kept")
		require.Equal(t, api.ChargeClaims, s.Fairness.Charge)
	}

	// Group weights: set, then clear, on every shard.
	status, body = b.call(t, http.MethodPut, "/v1/queues/fq/group-weights/acme", secretRoot, `{"weight": 3}`)
	require.Equal(t, http.StatusOK, status, "%s", body)
	status, body = b.call(t, http.MethodPut, "/v1/queues/fq/group-weights/acme", secretRoot, `{"weight": 4}`)
	require.Equal(t, http.StatusOK, status, "%s", body)
	var gw api.GroupWeightResult
	require.NoError(t, json.Unmarshal(body, &gw))
	for _, s := range gw.Shards {
		require.NotNil(t, s.OldWeight)
		require.Equal(t, 3.0, *s.OldWeight)
	}
	root := b.client(t, secretRoot)
	gw, err := root.ClearGroupWeight(b.ctx, "fq", "acme")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, gw.Status())
	for _, s := range gw.Shards {
		require.Equal(t, 4.0, *s.OldWeight)
	}
	gw, err = root.SetGroupWeight(b.ctx, "fq", "globex", 2)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, gw.Status())
	fr, err := root.QueueFairness(b.ctx, "fq")
	require.NoError(t, err)
	for _, s := range fr.Shards {
		require.Equal(t, []api.GroupWeight{{Group: "globex", Weight: 2}}, s.Fairness.GroupWeights, "a read lists the group weights left")
	}
	gw, err = root.ClearGroupWeight(b.ctx, "fq", "globex")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, gw.Status())
	two := false
	fr, err = root.SetQueueFairness(b.ctx, "fq", api.QueueFairnessRequest{TwoLevel: &two})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, fr.Status())
	fr, err = root.QueueFairness(b.ctx, "fq")
	require.NoError(t, err)
	for _, s := range fr.Shards {
		require.False(t, s.Fairness.TwoLevel)
		require.Equal(t, api.ChargeClaims, s.Fairness.Charge)
	}

	// Every change is audited on every shard, and the refusals too.
	var refused int
	require.NoError(t, b.dbs[0].QueryRow(b.ctx, `SELECT count(*) FROM audit WHERE queue = 'fq' AND outcome = 'refused'
		AND action IN ('queue.fairness', 'group_weight.set')`).Scan(&refused))
	require.Positive(t, refused, "refusals are audited (on the audit shard)")
	for _, db := range b.dbs {
		var actions []string
		rows, err := db.Query(b.ctx, `SELECT action || ':' || outcome FROM audit
			WHERE queue = 'fq' AND actor = 'root' AND outcome = 'ok' ORDER BY id`)
		require.NoError(t, err)
		for rows.Next() {
			var a string
			require.NoError(t, rows.Scan(&a))
			actions = append(actions, a)
		}
		require.NoError(t, rows.Err())
		require.Equal(t, []string{"queue.fairness:ok", "queue.fairness:ok", "group_weight.set:ok", "group_weight.set:ok",
			"group_weight.clear:ok", "group_weight.set:ok", "group_weight.clear:ok", "queue.fairness:ok"}, actions)
		var w float64
		require.ErrorContains(t, db.QueryRow(b.ctx, `SELECT weight FROM group_weights WHERE queue = 'fq'`).Scan(&w), "no rows")
	}
}
