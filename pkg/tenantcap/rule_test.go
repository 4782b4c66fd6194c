package tenantcap_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// decideCase is one decision: a rule and the counts the statement read.
type decideCase struct {
	rule                         tenantcap.Rule
	local, own, lease, scheduled int
	wantAdmit, wantMore          bool
	wantReason                   tenantcap.Reason
}

// drawRule draws a rule around the edges that matter: limits near the
// counts, multipliers that make Dynamic's float arithmetic round, absurd
// ones, and a scheduled share.
func drawRule(t *rapid.T) tenantcap.Rule {
	cfg := tenantcap.Config{
		Algorithm: rapid.SampledFrom(tenantcap.Algorithms()).Draw(t, "algorithm"),
		TFM: rapid.OneOf(
			rapid.Float64Range(tenantcap.MinTFM, 5),
			rapid.SampledFrom([]float64{0.1, 0.3, 1.0 / 3, 0.7, 1, 3, 2.5, 1e-9, 1e9, 1e300}),
		).Draw(t, "tfm"),
		ScheduledShare: rapid.SampledFrom([]float64{0, 0.01, 0.25, 1.0 / 3, 1}).Draw(t, "share"),
	}
	maxRuns := rapid.IntRange(1, 5000).Draw(t, "max_runs")
	return tenantcap.Rule{
		Config:  cfg,
		MaxRuns: maxRuns,
		Tenants: rapid.IntRange(0, 300).Draw(t, "tenants"),
		Others:  rapid.IntRange(0, maxRuns+3).Draw(t, "others"),
		Leased:  rapid.Bool().Draw(t, "leased"),
	}
}

// The statement's decision (harvest_admission_decide, with Rule.Params)
// is Rule.Judge's, for random rules and counts: the same admissions, the
// same reasons, and 'lease' exactly where Judge says more capacity would
// admit the run. Admitter.Check judges by Rule.Judge, so a start group
// admits what a start written alone would.
func TestAdmissionDecideMatchesJudge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testsvc.NewDB(t)
	rapid.Check(t, func(t *rapid.T) {
		cases := make([]decideCase, rapid.IntRange(1, 40).Draw(t, "cases"))
		for i := range cases {
			c := &cases[i]
			c.rule = drawRule(t)
			m := c.rule.MaxRuns
			c.local = rapid.IntRange(0, m+3).Draw(t, "local")
			c.own = rapid.IntRange(0, max(c.local, 1)).Draw(t, "own")
			c.lease = rapid.IntRange(0, m+3).Draw(t, "lease")
			cp := c.rule.ScheduledCap()
			c.scheduled = rapid.SampledFrom([]int{0, 0, 1, cp, cp + 1, rapid.IntRange(0, cp+5).Draw(t, "sched")}).Draw(t, "scheduled")
			var d tenantcap.Decision
			d, c.wantMore = c.rule.Judge("t", c.local, c.own, c.lease, c.scheduled)
			c.wantAdmit, c.wantReason = d.Admit, d.Reason
		}
		var (
			algorithms                       []string
			tfms                             []float64
			maxes, statics, others, caps     []int64
			leased                           []bool
			locals, owns, leases, scheduleds []int64
		)
		for _, c := range cases {
			p := c.rule.Params()
			algorithms, tfms, maxes = append(algorithms, p.Algorithm), append(tfms, p.TFM), append(maxes, p.MaxRuns)
			statics, others, caps = append(statics, p.StaticLimit), append(others, p.Others), append(caps, p.ScheduledCap)
			leased = append(leased, p.Leased)
			locals, owns = append(locals, int64(c.local)), append(owns, int64(c.own))
			leases, scheduleds = append(leases, int64(c.lease)), append(scheduleds, int64(c.scheduled))
		}
		rows, err := db.Query(ctx, `
			SELECT harvest_admission_decide(a, f, m, s, o, l, c, x, w, e, d)
			FROM unnest($1::text[], $2::float8[], $3::bigint[], $4::bigint[], $5::bigint[], $6::boolean[],
			            $7::bigint[], $8::bigint[], $9::bigint[], $10::bigint[], $11::bigint[])
			     WITH ORDINALITY AS u (a, f, m, s, o, l, c, x, w, e, d, n)
			ORDER BY n`,
			algorithms, tfms, maxes, statics, others, leased, caps, locals, owns, leases, scheduleds)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowTo[*string])
		require.NoError(t, err)
		require.Len(t, got, len(cases))
		for i, c := range cases {
			want := ""
			switch {
			case c.wantMore:
				want = string(tenantcap.ReasonLease)
			case !c.wantAdmit:
				want = string(c.wantReason)
			}
			have := ""
			if got[i] != nil {
				have = *got[i]
			}
			if have != want {
				t.Fatalf("case %d: %+v with local %d, own %d, lease %d, scheduled %d: the statement says %q, Judge %q",
					i, c.rule, c.local, c.own, c.lease, c.scheduled, have, want)
			}
		}
	})
}
