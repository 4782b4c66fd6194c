package runstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// A start group decided by its statement admits exactly what
// tenantcap.Rule.Judge admits when the group's starts are judged one
// after the other in the group's order, each with the counts the ones
// admitted before it left: random rules (every algorithm, leased or not,
// runs not due yet held to a share) against random counts, tenants and
// groups. Each start's figures (the tenant's count, the shard's count,
// its runs not due yet) are the ones Judge was given, and afterwards the
// tenants' counts and the shard's count hold exactly the admitted runs.
func TestStartGroupDecidesAsJudge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := &Committer{db: b.db, shard: 1}
	example := 0
	rapid.Check(t, func(t *rapid.T) {
		example++
		ctx := context.Background()
		_, err := b.db.Exec(ctx, `DELETE FROM tasks; DELETE FROM runs; DELETE FROM tenant_running`)
		require.NoError(t, err)

		maxRuns := rapid.IntRange(1, 40).Draw(t, "max_runs")
		rule := tenantcap.Rule{
			Config: tenantcap.Config{
				Algorithm:      rapid.SampledFrom(tenantcap.Algorithms()).Draw(t, "algorithm"),
				TFM:            rapid.SampledFrom([]float64{0.1, 0.25, 1.0 / 3, 0.5, 1, 3}).Draw(t, "tfm"),
				ScheduledShare: rapid.SampledFrom([]float64{0, 0.05, 0.5, 1}).Draw(t, "share"),
			},
			MaxRuns:    maxRuns,
			Tenants:    rapid.IntRange(1, 6).Draw(t, "tenants"),
			Others:     rapid.IntRange(0, maxRuns).Draw(t, "others"),
			Leased:     rapid.Bool().Draw(t, "leased"),
			RetryAfter: time.Second,
		}
		lease := rapid.IntRange(0, maxRuns+2).Draw(t, "lease")
		_, err = b.db.Exec(ctx, `UPDATE admission_lease SET granted = returned + $1`, lease)
		require.NoError(t, err)

		// The group's tenants start from drawn counts; the rest of the
		// shard holds what a tenant outside the group holds.
		names := []string{fmt.Sprintf("a%d", example), fmt.Sprintf("B%d", example), fmt.Sprintf("c_%d", example)}
		own := map[string]int{}
		for _, n := range names {
			own[n] = rapid.IntRange(0, maxRuns).Draw(t, "own_"+n[:1])
		}
		own["rest"] = rapid.IntRange(0, maxRuns).Draw(t, "rest")
		for n, k := range own {
			_, err := b.db.Exec(ctx, `INSERT INTO tenant_running (tenant, running) VALUES ($1, $2)`, n, k)
			require.NoError(t, err)
		}
		local := 0
		for _, k := range own {
			local += k
		}

		starts := rapid.IntRange(1, 12).Draw(t, "starts")
		var items []*pending
		for i := range starts {
			req := api.StartRequest{ID: fmt.Sprint("s", i), Name: "echo", Queue: "shared"}
			if rapid.IntRange(0, 3).Draw(t, "later") == 0 {
				d := api.Duration(time.Hour)
				req.Delay = &d
			}
			it := &pending{p: StartParams{Tenant: rapid.SampledFrom(names).Draw(t, "tenant"), Shard: 1, Req: req}}
			it.row, err = startRowOf(&it.p)
			require.NoError(t, err)
			items = append(items, it)
		}
		g := newGroup(items)
		require.NoError(t, c.write(ctx, g, &rule, false))

		// The model: Judge, start by start, in the group's order.
		held := map[string]int{}
		for _, it := range g.sent {
			tn := it.p.Tenant
			scheduled := 0
			if it.p.Req.Delay != nil {
				scheduled = held[tn] + 1
			}
			d, more := rule.Judge(tn, local, own[tn], lease, scheduled)
			st := it.st
			want := outcomeRefused
			switch {
			case more:
				want = outcomeLease
			case d.Admit:
				want = outcomeNew
			}
			require.Equal(t, want, st.Outcome, "start %s/%s (%+v)", tn, it.p.Req.ID, d)
			if want == outcomeRefused {
				require.Equal(t, string(d.Reason), st.Reason)
			}
			require.Equal(t, [3]int{own[tn], local, scheduled}, [3]int{int(st.Own), int(st.Shard), int(st.Scheduled)},
				"the counts start %s/%s was judged with", tn, it.p.Req.ID)
			require.Equal(t, lease, int(st.Lease))
			if want == outcomeNew {
				own[tn]++
				local++
				if scheduled > 0 {
					held[tn]++
				}
			}
		}
		for _, n := range names {
			var got int
			require.NoError(t, b.db.QueryRow(ctx, `SELECT running FROM tenant_running WHERE tenant = $1`, n).Scan(&got))
			require.Equal(t, own[n], got, "tenant %s", n)
		}
		var total int
		require.NoError(t, b.db.QueryRow(ctx, `SELECT harvest_shard_running()`).Scan(&total))
		require.Equal(t, local, total)
	})
}
