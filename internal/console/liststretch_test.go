package console_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/harvest-run/harvest/internal/console"
	"github.com/harvest-run/harvest/pkg/api"
)

// Paging through the console's listing with any bound on the runs a page
// reads per shard shows exactly the runs the filters match, each once,
// every shard's in falling pk order across pages, and ends: the bound
// changes where pages end, never what the listing holds.
func TestListRunsStretchKeepsTheListing(t *testing.T) {
	t.Parallel()
	ctx, dbs := setup(t, 2)
	statuses := []api.Status{api.StatusQueued, api.StatusCompleted, api.StatusFailed}
	rapid.Check(t, func(rt *rapid.T) {
		// pks restart at 1, so a stretch can end on a shard's first run.
		for _, db := range dbs {
			_, err := db.Exec(ctx, `TRUNCATE runs RESTART IDENTITY CASCADE`)
			require.NoError(rt, err)
		}
		type placed struct {
			shard int
			pk    int64
		}
		n := rapid.IntRange(0, 24).Draw(rt, "runs")
		want := map[string]placed{}
		f := console.RunFilter{
			Tenant:  rapid.SampledFrom([]string{"", "acme"}).Draw(rt, "tenant"),
			Queue:   rapid.SampledFrom([]string{"", "a"}).Draw(rt, "queue"),
			Limit:   rapid.IntRange(1, 5).Draw(rt, "limit"),
			MaxScan: rapid.IntRange(1, 6).Draw(rt, "scan"),
		}
		if rapid.Bool().Draw(rt, "status filter") {
			f.Statuses = []api.Status{rapid.SampledFrom(statuses).Draw(rt, "status")}
		}
		for i := range n {
			r := run{
				id:     fmt.Sprintf("r%02d", i),
				tenant: rapid.SampledFrom([]string{"acme", "globex"}).Draw(rt, "run tenant"),
				queue:  rapid.SampledFrom([]string{"a", "b"}).Draw(rt, "run queue"),
				status: rapid.SampledFrom(statuses).Draw(rt, "run status"),
				at:     at(time.Duration(rapid.IntRange(0, 5).Draw(rt, "run at")) * time.Second),
			}
			shard := rapid.IntRange(0, len(dbs)-1).Draw(rt, "run shard")
			pk := addRun(t, dbs[shard], r)
			if (f.Tenant == "" || r.tenant == f.Tenant) && (f.Queue == "" || r.queue == f.Queue) &&
				(len(f.Statuses) == 0 || slices.Contains(f.Statuses, r.status)) {
				want[r.id] = placed{shard, pk}
			}
		}

		got := map[string]placed{}
		shownBelow := map[int]int64{}
		for pages := 1; ; pages++ {
			require.LessOrEqual(rt, pages, n+2, "paging ends")
			p, err := console.ListRuns(ctx, dbs, f)
			if err != nil {
				rt.Fatalf("page %d: %v", pages, err)
			}
			require.LessOrEqual(rt, len(p.Runs), f.Limit)
			for _, r := range p.Runs {
				w, ok := want[r.ID]
				require.True(rt, ok, "%s is not a run of the listing", r.ID)
				require.NotContains(rt, got, r.ID, "listed twice")
				got[r.ID] = w
				if last, ok := shownBelow[w.shard]; ok {
					require.Less(rt, w.pk, last, "shard %d out of pk order across pages", w.shard)
				}
			}
			for _, r := range p.Runs {
				w := want[r.ID]
				if last, ok := shownBelow[w.shard]; !ok || w.pk < last {
					shownBelow[w.shard] = w.pk
				}
			}
			if p.NextCursor == "" {
				break
			}
			f.Cursor = p.NextCursor
		}
		require.Equal(rt, want, got)
	})
}
