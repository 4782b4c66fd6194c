package gateway

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
)

// A tenant's token with weights:read reads a queue's fairness modes, but
// of the group weights only its own group's, and not which operator's
// token changed the modes; an operator's token sees every group and who.
func TestTenantFairnessReadShowsOnlyItsGroup(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	mine, theirs := tenantOn[0], tenantOn[1]
	root := b.client(t, secretRoot)
	two := true
	_, err := root.SetQueueFairness(b.ctx, "fq", api.QueueFairnessRequest{TwoLevel: &two})
	require.NoError(t, err)
	for group, w := range map[string]float64{mine: 2, theirs: 5} {
		_, err = root.SetGroupWeight(b.ctx, "fq", group, w)
		require.NoError(t, err)
	}

	status, out := b.call(t, http.MethodGet, "/v1/queues/fq/fairness", secretAOps, nil)
	require.Equal(t, http.StatusOK, status, string(out))
	require.NotContains(t, string(out), theirs, "another tenant's group and weight")
	require.NotContains(t, string(out), "root", "the operator's token")
	require.NotContains(t, string(out), "updated_by")
	res := decode[api.QueueFairnessResult](t, out)
	require.Len(t, res.Shards, 2)
	for _, s := range res.Shards {
		require.True(t, s.Fairness.TwoLevel, "the modes apply to every tenant and are shown")
		require.Equal(t, []api.GroupWeight{{Group: mine, Weight: 2}}, s.Fairness.GroupWeights)
	}

	status, out = b.call(t, http.MethodGet, "/v1/queues/fq/fairness", secretWRead, nil)
	require.Equal(t, http.StatusOK, status, string(out))
	res = decode[api.QueueFairnessResult](t, out)
	for _, s := range res.Shards {
		require.Len(t, s.Fairness.GroupWeights, 2, "an operator sees every group")
		require.Equal(t, "root", s.Fairness.UpdatedBy)
	}
}

// A tenant's token learns from the keys view that a queue is paused and
// since when, not which operator's token paused it; an operator does.
func TestTenantKeysViewNamesNoOperator(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	_, err := b.client(t, secretRoot).PauseQueue(b.ctx, "pq")
	require.NoError(t, err)

	status, out := b.call(t, http.MethodGet, "/v1/queues/pq/keys", secretAOps, nil)
	require.Equal(t, http.StatusOK, status, string(out))
	require.NotContains(t, string(out), "root")
	res := decode[api.KeysResult](t, out)
	require.Equal(t, []int{0, 1}, res.PausedShards)
	for _, s := range res.Shards {
		require.NotNil(t, s.Paused)
		require.False(t, s.Paused.At.IsZero())
		require.Empty(t, s.Paused.By)
	}

	status, out = b.call(t, http.MethodGet, "/v1/queues/pq/keys", secretWRead, nil)
	require.Equal(t, http.StatusOK, status, string(out))
	for _, s := range decode[api.KeysResult](t, out).Shards {
		require.Equal(t, "root", s.Paused.By)
	}
}

// A run's id and name refuse the bidirectional controls, over HTTP (one
// start and a batch item) and over NATS, with 400 naming the field; the
// refused start writes nothing.
func TestStartRefusesBidiInIDAndName(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for _, c := range []struct{ field, body string }{
		{"id", `{"id":"inv\u202egpj.exe","name":"echo","queue":"shared"}`},
		{"id", `{"id":"a\u2066b","name":"echo","queue":"shared"}`},
		{"name", `{"name":"echo\u200f","queue":"shared"}`},
		{"name", `{"name":"\u061cecho","queue":"shared"}`},
	} {
		status, out := b.call(t, http.MethodPost, "/v1/runs", secretA, c.body)
		require.Equal(t, http.StatusBadRequest, status, "%s: %s", c.body, out)
		e := apiErr(t, out)
		require.Equal(t, c.field, e.Field, string(out))
		require.Contains(t, e.Message, "bidirectional")

		status, out = b.natsCall(t, "harvest.start."+tenantOn[0], c.body)
		require.Equal(t, http.StatusBadRequest, status, "%s: %s", c.body, out)
		require.Equal(t, c.field, apiErr(t, out).Field, string(out))

		status, out = b.call(t, http.MethodPost, "/v1/runs/batch", secretA, `{"runs":[`+c.body+`]}`)
		require.Equal(t, http.StatusOK, status, string(out))
		var batch api.BatchStartResponse
		require.NoError(t, json.Unmarshal(out, &batch))
		require.Len(t, batch.Results, 1)
		require.NotNil(t, batch.Results[0].Error, string(out))
		require.Equal(t, c.field, batch.Results[0].Error.Field)
	}
	b.nothingWritten(t, "bidi starts")
	// The escapes above are JSON's; the characters themselves in the body
	// are refused the same way.
	status, out := b.call(t, http.MethodPost, "/v1/runs", secretA, strings.ReplaceAll(`{"id":"xRy","name":"echo","queue":"shared"}`, "R", "\u202e"))
	require.Equal(t, http.StatusBadRequest, status, string(out))
	require.Equal(t, "id", apiErr(t, out).Field)
}
