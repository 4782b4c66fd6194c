package runstore

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testfactory"
	"github.com/harvest-run/harvest/pkg/api"
)

// List reads no output (Get does), and ends a page rather than pass its
// byte budget: with 10 KB errors and a 25 KB budget, pages of two runs,
// the cursor continuing exactly after each; a run larger than the budget
// alone still makes a page of its own.
func TestListLeavesOutOutputAndBoundsBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 7 {
		testfactory.Run(b.ctx, t, b.db, testfactory.RunOpts{Tenant: "acme"})
	}
	_, err := b.db.Exec(b.ctx, `
		UPDATE runs SET output = to_jsonb(repeat('x', 1 << 20)),
		                error = CASE WHEN pk = (SELECT min(pk) FROM runs) THEN repeat('E', 40 << 10)
		                             ELSE repeat('e', 10 << 10) END`)
	require.NoError(t, err)

	var sizes []int
	var all []string
	cursor := ""
	for {
		page, err := List(b.ctx, b.db, ListParams{Tenant: "acme", Limit: 1000, Cursor: cursor, MaxBytes: 25 << 10})
		require.NoError(t, err)
		size := 0
		for _, r := range page.Runs {
			require.Zero(t, len(r.Output), "a listing reads no output")
			require.NotNil(t, r.Error)
			item, err := json.Marshal(api.ListItem(r))
			require.NoError(t, err)
			size += len(item) + 1
			all = append(all, r.ID)
		}
		sizes = append(sizes, len(page.Runs))
		if len(page.Runs) > 1 {
			require.LessOrEqual(t, size, 25<<10)
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	require.Equal(t, []int{2, 2, 2, 1}, sizes)
	require.Len(t, all, 7)
	seen := map[string]bool{}
	for _, id := range all {
		require.False(t, seen[id], id)
		seen[id] = true
	}

	run, err := Get(b.ctx, b.db, "acme", all[0], 0)
	require.NoError(t, err)
	require.Greater(t, len(run.Output), 1<<20, "Get reads the output")

	// Past the limit the page ends too, whatever the budget.
	page, err := List(b.ctx, b.db, ListParams{Tenant: "acme", Limit: 3})
	require.NoError(t, err)
	require.Len(t, page.Runs, 3)
	require.NotEmpty(t, page.NextCursor)
	require.True(t, strings.HasPrefix(*page.Runs[0].Error, "e"))
}
