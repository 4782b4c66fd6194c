package soak

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/harvest-run/harvest/internal/pgrow"
)

// rampLog judges the steps of a ramp: each step's rate held for its time.
type rampLog struct {
	f     *Fleet
	load  *Load
	mon   *Monitor
	bound time.Duration

	from                 time.Time
	acked, giveups, viol int
	steps                []rampStep
}

// rampStep is what one step of the ramp saw.
type rampStep struct {
	rate       float64          // asked
	acked      float64          // acknowledged starts per second
	claims     float64          // task claims per second over the shards
	wait       [3]time.Duration // p50, p95, p99 claim wait (worst shard)
	unfinished int
	giveups    int
	violations int
	failed     string // why the step failed; empty when it held
}

func (s rampStep) String() string {
	st := "held"
	if s.failed != "" {
		st = "FAILED: " + s.failed
	}
	return fmt.Sprintf("%.0f acked/s, %.0f claims/s, claim wait p50 %s p95 %s p99 %s, %d unfinished, %d given up, %d violations: %s",
		s.acked, s.claims, s.wait[0].Round(time.Millisecond), s.wait[1].Round(time.Millisecond), s.wait[2].Round(time.Millisecond),
		s.unfinished, s.giveups, s.violations, st)
}

// step closes the step under way.
func (r *rampLog) step(ctx context.Context) rampStep {
	now := time.Now()
	el := now.Sub(r.from)
	_, acked, _, giveups := r.load.Stats()
	viol := 0
	if r.mon != nil {
		viol = len(r.mon.Report().Violations)
	}
	st := rampStep{rate: r.load.Rate(), acked: float64(acked-r.acked) / el.Seconds(), giveups: giveups - r.giveups,
		violations: viol - r.viol, unfinished: r.f.Unfinished(ctx)}
	claims, wait := r.f.ClaimWait(ctx, el)
	st.claims, st.wait = float64(claims)/el.Seconds(), wait
	st.failed = st.judge(r.bound)
	r.steps = append(r.steps, st)
	r.from, r.acked, r.giveups, r.viol = now, acked, giveups, viol
	return st
}

// judge says why the step failed, or "" when it held: a promise broke,
// its p95 claim wait passed bound, the load could not get its rate
// acknowledged, or a start was given up.
func (s rampStep) judge(bound time.Duration) string {
	var why []string
	if s.violations > 0 {
		why = append(why, fmt.Sprintf("%d promise(s) broken", s.violations))
	}
	if s.wait[1] > bound {
		why = append(why, fmt.Sprintf("p95 claim wait %s over the bound of %s", s.wait[1].Round(time.Millisecond), bound))
	}
	if s.acked < 0.9*s.rate {
		why = append(why, fmt.Sprintf("the load sent %.0f of its %.0f starts/s", s.acked, s.rate))
	}
	if s.giveups > 0 {
		why = append(why, fmt.Sprintf("%d starts given up", s.giveups))
	}
	return strings.Join(why, "; ")
}

// String is the ramp's table.
func (r *rampLog) String() string {
	var b strings.Builder
	fmt.Fprintln(&b, "ramp:")
	tw := tabwriter.NewWriter(&b, 1, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "asked/s\tacked/s\tclaims/s\tclaim wait p50 / p95 / p99\tunfinished\tgiven up\tviolations\toutcome\t")
	for _, s := range r.steps {
		out := "held"
		if s.failed != "" {
			out = "failed: " + s.failed
		}
		fmt.Fprintf(tw, "%.0f\t%.0f\t%.0f\t%s / %s / %s\t%d\t%d\t%d\t%s\t\n", s.rate, s.acked, s.claims,
			s.wait[0].Round(time.Millisecond), s.wait[1].Round(time.Millisecond), s.wait[2].Round(time.Millisecond),
			s.unfinished, s.giveups, s.violations, out)
	}
	_ = tw.Flush()
	return b.String()
}

// ClaimWait returns the claims of the last d over every shard and the
// worst shard's p50, p95 and p99 wait of a claimed task after it was due
// (claimed_at - due_at; a retried task is due again at its retry, a
// rescued one counts from its first due time). The weighted pair's bursts
// are left out: they are made due all at once, so that they wait.
func (f *Fleet) ClaimWait(ctx context.Context, d time.Duration) (int, [3]time.Duration) {
	_, total, worst := f.claimFigures(ctx, d)
	return total, worst
}

// claimFigures is ClaimWait with, first, the claims of the last d
// including the pair's.
func (f *Fleet) claimFigures(ctx context.Context, d time.Duration) (all, total int, worst [3]time.Duration) {
	for _, p := range f.direct {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		type claims struct {
			All   int       `db:"all_claims"`
			Mix   int       `db:"mix_claims"`
			Waits []float64 `db:"waits"`
		}
		c, err := pgrow.One[claims](qctx, p, `SELECT count(*) AS all_claims,
			count(*) FILTER (WHERE fairness_key NOT IN ($3, $4)) AS mix_claims,
			coalesce(percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP
			(ORDER BY extract(epoch FROM claimed_at - due_at)) FILTER (WHERE fairness_key NOT IN ($3, $4)), ARRAY[0, 0, 0]::float8[]) AS waits
			FROM tasks WHERE queue = $1 AND claimed_at > now() - make_interval(secs => $2)`,
			Queue, d.Seconds(), PairHeavy, PairLight)
		cancel()
		if err != nil || len(c.Waits) != 3 {
			continue
		}
		all += c.All
		total += c.Mix
		for i := range worst {
			worst[i] = max(worst[i], time.Duration(c.Waits[i]*float64(time.Second)))
		}
	}
	return all, total, worst
}

// Behind counts the tasks over every shard that are due and not claimed
// (pending, or scheduled and past their time), the weighted pair's bursts
// left out as in ClaimWait; -1 when a shard cannot be read.
func (f *Fleet) Behind(ctx context.Context) int {
	total := 0
	for _, p := range f.direct {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		var n int
		err := p.QueryRow(qctx, `SELECT count(*) FROM tasks WHERE state IN ('pending', 'scheduled') AND due_at <= now()
			AND fairness_key NOT IN ($1, $2)`, PairHeavy, PairLight).Scan(&n)
		cancel()
		if err != nil {
			return -1
		}
		total += n
	}
	return total
}
