package cli

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
)

// `harvest runs get` prints why a queued run waits, and its --json carries
// the waiting object as the API sent it.
func TestPrintRunWaiting(t *testing.T) {
	t.Parallel()
	key := "acme/k1"
	run := api.Run{ID: "r1", Tenant: "acme", Name: "echo", Queue: "q", Status: api.StatusQueued,
		CreatedAt: api.Time{Time: time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)},
		Waiting:   &api.RunWaiting{Reason: api.WaitFairOrder, FairnessKey: &key, KeysAhead: 3, ClaimsAhead: 41}}
	var out bytes.Buffer
	require.NoError(t, printRun(env{stdout: &out, stderr: &out}, run, false))
	require.Contains(t, out.String(), `waiting   fair_order: behind 3 other keys in the fair order (key "acme/k1"): about 41 claims ahead`)

	out.Reset()
	require.NoError(t, printRun(env{stdout: &out, stderr: &out}, run, true))
	var back struct {
		Waiting map[string]any `json:"waiting"`
	}
	require.NoError(t, json.Unmarshal(out.Bytes(), &back))
	require.Equal(t, map[string]any{"reason": "fair_order", "fairness_key": "acme/k1", "keys_ahead": 3.0, "claims_ahead": 41.0},
		back.Waiting)

	out.Reset()
	run.Status, run.Waiting = api.StatusRunning, nil
	require.NoError(t, printRun(env{stdout: &out, stderr: &out}, run, false))
	require.NotContains(t, out.String(), "waiting")
}
