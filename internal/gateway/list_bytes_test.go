package gateway

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/pkg/api"
)

// A listing stays under its byte bound whatever its runs hold: 40 runs with
// 1 MB outputs (an echo's output is its input) list without their outputs,
// and 100 KB errors on half of them end pages early, with a cursor that
// pages through every run exactly once. GET /v1/runs/{id} still has the
// output.
func TestListAnswersBoundedInBytes(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	tenant := tenantOn[0]
	fillRuns(t, b, tenant, 40)
	shard := b.gw.home(tenant)
	_, err := b.dbs[shard].Exec(b.ctx, `
		UPDATE runs SET output = to_jsonb(repeat('x', 1 << 20)),
		                error = CASE WHEN pk % 2 = 0 THEN repeat('e', 100 << 10) END
		WHERE tenant = $1`, tenant)
	require.NoError(t, err)

	seen := map[string]bool{}
	cursor := ""
	pages := 0
	for {
		q := url.Values{"limit": {"1000"}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		status, out := b.call(t, "GET", "/v1/runs?"+q.Encode(), secretA, nil)
		require.Equal(t, http.StatusOK, status, string(out))
		require.Less(t, len(out), runstore.MaxListBytes+4096, "page %d is %d bytes", pages, len(out))
		var raw struct {
			Runs       []map[string]json.RawMessage `json:"runs"`
			NextCursor string                       `json:"next_cursor"`
		}
		require.NoError(t, json.Unmarshal(out, &raw))
		require.NotEmpty(t, raw.Runs)
		for _, r := range raw.Runs {
			require.NotContains(t, r, "output", "a listed run has no output key")
			require.Contains(t, r, "error")
			require.Contains(t, r, "finished_at", "every other field of the Run resource is there")
			var id string
			require.NoError(t, json.Unmarshal(r["id"], &id))
			require.False(t, seen[id], "run %s listed twice", id)
			seen[id] = true
		}
		pages++
		if raw.NextCursor == "" {
			break
		}
		cursor = raw.NextCursor
	}
	require.Len(t, seen, 40)
	require.Greater(t, pages, 1, "the errors alone (2 MB) take more than one page")

	for id := range seen {
		status, out := b.call(t, "GET", "/v1/runs/"+url.PathEscape(id), secretA, nil)
		require.Equal(t, http.StatusOK, status)
		require.Greater(t, len(decode[api.Run](t, out).Output), 1<<20, "the run's own answer has its output")
		break
	}
}
