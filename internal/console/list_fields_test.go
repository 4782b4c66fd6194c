package console_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/console"
)

// A page of runs reads neither output nor error, which a workflow can make
// as large as it likes: 50 runs with 1 MB outputs and errors make a page
// of a few KB. The run's own page (Inspect) has both.
func TestListRunsLeavesOutOutputAndError(t *testing.T) {
	t.Parallel()
	ctx, dbs := setup(t, 1)
	for range 50 {
		addRun(t, dbs[0], run{})
	}
	_, err := dbs[0].Exec(ctx, `UPDATE runs SET output = to_jsonb(repeat('x', 1 << 20)), error = repeat('e', 1 << 20)`)
	require.NoError(t, err)
	page, err := console.ListRuns(ctx, dbs, console.RunFilter{})
	require.NoError(t, err)
	require.Len(t, page.Runs, 50)
	for _, r := range page.Runs {
		require.Zero(t, len(r.Output), "a page reads no output")
		require.Nil(t, r.Error, "a page reads no error")
	}
	d, err := console.Inspect(ctx, dbs[0], 0, "acme", page.Runs[0].ID)
	require.NoError(t, err)
	require.Greater(t, len(d.Run.Output), 1<<20)
	require.NotNil(t, d.Run.Error)
	require.Len(t, *d.Run.Error, 1<<20)
}
