package claim_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/harvest-run/harvest/pkg/claim"
)

// plCalls gives a test its own connection of b's pool, on which PL/pgSQL
// calls are counted, and calls(fn): the calls of fn on it so far (the
// single and bulk steps its batches took).
func plCalls(t testing.TB, b *bundle) (*pgxpool.Conn, func(t require.TestingT, fn string) int) {
	conn, err := b.db.Acquire(b.ctx)
	require.NoError(t, err)
	t.Cleanup(conn.Release)
	_, err = conn.Exec(b.ctx, `SET track_functions = 'pl'`)
	require.NoError(t, err)
	return conn, func(t require.TestingT, fn string) int {
		// Counts reach the statistics views once flushed.
		_, err := conn.Exec(b.ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
		var n int
		require.NoError(t, conn.QueryRow(b.ctx, `SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions
			WHERE funcname = $1`, fn).Scan(&n))
		return n
	}
}

// quotaState is what the rechecks leave behind: each bucket's tokens and
// time, and the running rows of each quota key.
func (b *bundle) quotaState(t require.TestingT) []string {
	rows, err := b.db.Query(b.ctx, `
		SELECT 'bucket ' || quota_key || ': ' || tokens || ' @ ' || updated_at FROM rate_buckets
		UNION ALL
		SELECT 'running ' || quota_key || ': ' || count(*) FROM tasks WHERE state = 'running' GROUP BY quota_key
		ORDER BY 1`)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// sameResults checks a batch's results against the single claims'.
func sameResults(t require.TestingT, want, got []claim.Result) {
	require.Len(t, got, len(want))
	for i := range want {
		require.Equal(t, want[i].OK, got[i].OK, "result %d", i)
		require.Equal(t, want[i].Task.ID, got[i].Task.ID, "result %d", i)
		require.Equal(t, want[i].Empty, got[i].Empty, "result %d", i)
		require.Equal(t, want[i].Refused, got[i].Refused, "refusals of result %d", i)
	}
}

// singles takes up to n single claims, as a batch of n reports them: up to
// the first claim without a row, kept when it was refused.
func (b *bundle) singles(t require.TestingT, req claim.Request, n int) []claim.Result {
	var out []claim.Result
	for range n {
		r, err := claim.Claim(b.ctx, b.db, req)
		require.NoError(t, err)
		if !r.OK {
			if r.Empty == claim.EmptyRefused {
				out = append(out, r)
			}
			break
		}
		out = append(out, r)
	}
	return out
}

// An ordinary batch over rows with quota keys stays in one bulk step: the
// step makes the rechecks itself (a cap reached, a bucket emptied, a quota
// that limits nothing, a quota key without a quota), skips the rows of a
// refused quota key and reports the refusals on every row taken after
// them, as the single claims on a twin database do; the caps and buckets
// end the same.
func TestOrdinaryBatchWithQuotaRowsTakesOneBulkStep(t *testing.T) {
	t.Parallel()
	single, batch := setup(t), setup(t)
	// In claim order: rows without a quota key between rows of "cap" (a
	// cap of 2, one running already), "rate" (a bucket of 3 tokens),
	// "free" (a quota row without limits) and "none" (no quota row).
	quotas := []string{"cap", "rate", "free", "none"}
	var want []int64
	for _, b := range []*bundle{single, batch} {
		b.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent, rate, burst) VALUES
			('q', 'cap', 2, NULL, NULL), ('q', 'rate', NULL, 0.001, 3), ('q', 'free', NULL, NULL, NULL)`)
		running := b.task(taskOpts{QuotaKey: "cap", DueAt: t0})
		b.exec(`UPDATE tasks SET state = 'running' WHERE id = $1`, running)
		var ids []int64
		for i := range 24 {
			ids = append(ids, b.task(taskOpts{QuotaKey: quotas[i%4], DueAt: t0.Add(time.Duration(2*i+1) * time.Second)}))
			ids = append(ids, b.task(taskOpts{DueAt: t0.Add(time.Duration(2*i+2) * time.Second)}))
		}
		want = ids
	}
	req := claim.Request{Queue: "q", Worker: "w", Now: t0.Add(time.Hour), Lease: time.Minute}
	conn, calls := plCalls(t, batch)
	got, err := claim.ClaimBatch(batch.ctx, conn, req, 30)
	require.NoError(t, err)
	require.Equal(t, 1, calls(t, "harvest_claim_bulk"), "bulk steps")
	require.Equal(t, 0, calls(t, "harvest_claim_step"), "single steps")
	sameResults(t, single.singles(t, req, 30), got)

	// The first "cap" row is taken (one running, cap 2), the second
	// refused; three "rate" rows are taken, the fourth refused; every row
	// after a refusal reports it.
	require.Len(t, got, 30)
	capRefused := claim.Refusal{TaskID: want[8], QuotaKey: "cap", Reason: claim.ReasonConcurrencyCap}
	rateRefused := claim.Refusal{TaskID: want[26], QuotaKey: "rate", Reason: claim.ReasonRateLimit}
	taken := map[string]int{}
	for _, r := range got {
		require.True(t, r.OK)
		taken[r.Task.QuotaKey]++
		switch {
		case r.Task.ID > want[26]:
			require.Equal(t, []claim.Refusal{capRefused, rateRefused}, r.Refused, "row %d", r.Task.ID)
		case r.Task.ID > want[8]:
			require.Equal(t, []claim.Refusal{capRefused}, r.Refused, "row %d", r.Task.ID)
		default:
			require.Empty(t, r.Refused, "row %d", r.Task.ID)
		}
	}
	require.Equal(t, map[string]int{"": 18, "cap": 1, "rate": 3, "free": 4, "none": 4}, taken)
	require.Equal(t, single.quotaState(t), batch.quotaState(t))
	var tokens float64
	require.NoError(t, batch.db.QueryRow(batch.ctx, `SELECT tokens FROM rate_buckets WHERE quota_key = 'rate'`).Scan(&tokens))
	require.Zero(t, tokens)
}

// A claim that would reach 8 refusals ends the batch with them: the bulk
// step takes the rows before it, and that claim is the single claim's.
func TestOrdinaryBatchEndsAtEightRefusals(t *testing.T) {
	t.Parallel()
	single, batch := setup(t), setup(t)
	for _, b := range []*bundle{single, batch} {
		// Nine quota keys, each at its cap of 1; in claim order a row of
		// no quota key, then a row of each quota key followed by one of
		// none.
		for k := range 9 {
			qk := fmt.Sprintf("c%d", k)
			b.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent) VALUES ('q', $1, 1)`, qk)
			running := b.task(taskOpts{QuotaKey: qk, DueAt: t0})
			b.exec(`UPDATE tasks SET state = 'running' WHERE id = $1`, running)
		}
		b.task(taskOpts{DueAt: t0.Add(time.Second)})
		for k := range 9 {
			b.task(taskOpts{QuotaKey: fmt.Sprintf("c%d", k), DueAt: t0.Add(time.Duration(2*k+2) * time.Second)})
			b.task(taskOpts{DueAt: t0.Add(time.Duration(2*k+3) * time.Second)})
		}
	}
	req := claim.Request{Queue: "q", Worker: "w", Now: t0.Add(time.Hour), Lease: time.Minute}
	conn, calls := plCalls(t, batch)
	got, err := claim.ClaimBatch(batch.ctx, conn, req, 20)
	require.NoError(t, err)
	want := single.singles(t, req, 20)
	sameResults(t, want, got)
	// Eight rows, the last with 7 refusals, then the claim refused 8 times.
	require.Len(t, got, 9)
	require.Len(t, got[7].Refused, 7)
	require.False(t, got[8].OK)
	require.Equal(t, claim.EmptyRefused, got[8].Empty)
	require.Len(t, got[8].Refused, 8)
	// The rows in one bulk step, a second that takes nothing, and the
	// refused claim.
	require.Equal(t, 2, calls(t, "harvest_claim_bulk"), "bulk steps")
	require.Equal(t, 1, calls(t, "harvest_claim_step"), "single steps")
	require.Equal(t, single.quotaState(t), batch.quotaState(t))
}

// For random backlogs (priorities, bands, rows pinned to the claiming
// worker or another, rows another transaction holds, quota keys with caps,
// buckets, both or no quota) an ordinary batch of n gives exactly what n single claims give
// on a twin database: the same rows in the same order, the same refusals,
// the same buckets and running rows. The test also checks that batches
// that took quota rows and reported refusals stayed in bulk: at most the
// single claim that ends a batch short (nothing left, or refused), after
// a bulk step that took nothing.
func TestOrdinaryBulkMatchesSingleClaims(t *testing.T) {
	t.Parallel()
	single, batch := setup(t), setup(t)
	conn, calls := plCalls(t, batch)
	var inBulk int
	rapid.Check(t, func(rt *rapid.T) {
		for _, b := range []*bundle{single, batch} {
			b.exec(`TRUNCATE runs, tasks, move_out, fair_state, fair_queues, fair_arrivals, weight_overrides,
				weight_override_counts, quotas, rate_buckets, tenant_running RESTART IDENTITY`)
		}
		now := t0.Add(time.Hour)
		req := claim.Request{Queue: "q", Worker: "w", Now: now, Lease: time.Minute}
		run := []int64{single.run(runOpts{MaxAttempts: 100}), batch.run(runOpts{MaxAttempts: 100})}
		nq := rapid.IntRange(1, 10).Draw(rt, "quota keys")
		for q := range nq {
			drawQuota(rt, []*bundle{single, batch}, fmt.Sprintf("q%d", q), 3, 1)
		}
		// The rows, in one statement per database (ids in draw order).
		var (
			quota, pin    []string
			prio          []int
			cont          []bool
			due, pinUntil []*time.Time
		)
		for range rapid.IntRange(0, 30).Draw(rt, "rows") {
			d := t0.Add(time.Duration(rapid.IntRange(0, 60).Draw(rt, "due")) * time.Second)
			due = append(due, &d)
			cont = append(cont, rapid.IntRange(0, 9).Draw(rt, "cont") == 0)
			p := 0
			if rapid.IntRange(0, 3).Draw(rt, "prio") == 0 {
				p = 1
			}
			prio = append(prio, p)
			qk := ""
			if q := rapid.IntRange(-3, nq-1).Draw(rt, "quota"); q >= 0 {
				qk = fmt.Sprintf("q%d", q)
			}
			quota = append(quota, qk)
			w, until := "", (*time.Time)(nil)
			if rapid.IntRange(0, 9).Draw(rt, "pinned") == 0 {
				w = rapid.SampledFrom([]string{"w", "v"}).Draw(rt, "pin")
				u := now.Add(time.Duration(rapid.IntRange(-2, 8).Draw(rt, "pin for")) * time.Minute)
				until = &u
			}
			pin, pinUntil = append(pin, w), append(pinUntil, until)
		}
		for i, b := range []*bundle{single, batch} {
			b.exec(`INSERT INTO tasks (run_pk, queue, quota_key, priority, continuation, due_at, sticky_worker, sticky_until, input)
				SELECT $1, 'q', r.qk, r.prio, r.cont, r.due, nullif(r.pin, ''), r.until, '{}'
				FROM unnest($2::text[], $3::int[], $4::boolean[], $5::timestamptz[], $6::text[], $7::timestamptz[])
				     WITH ORDINALITY AS r(qk, prio, cont, due, pin, until, o)
				ORDER BY r.o`, run[i], quota, prio, cont, due, pin, pinUntil)
		}
		// Some claims first, at an earlier time: running rows, buckets
		// partly drained and refilling.
		for range rapid.IntRange(0, 6).Draw(rt, "before") {
			r := claim.Request{Queue: "q", Worker: "w", Now: now.Add(-time.Second), Lease: time.Minute}
			a, b := single.claim(r), batch.claim(r)
			require.Equal(rt, a.Task.ID, b.Task.ID)
		}
		// Rows another transaction holds: every claim skips them.
		held := rapid.SliceOfN(rapid.Int64Range(1, 30), 0, 4).Draw(rt, "held")
		for _, b := range []*bundle{single, batch} {
			tx, err := b.db.Begin(b.ctx)
			require.NoError(rt, err)
			defer tx.Rollback(b.ctx) //nolint:errcheck // read only
			_, err = tx.Exec(b.ctx, `SELECT id FROM tasks WHERE id = ANY ($1) FOR UPDATE`, held)
			require.NoError(rt, err)
		}

		n := rapid.IntRange(2, 30).Draw(rt, "n")
		steps0, bulk0 := calls(rt, "harvest_claim_step"), calls(rt, "harvest_claim_bulk")
		got, err := claim.ClaimBatch(batch.ctx, conn, req, n)
		require.NoError(rt, err)
		steps, bulk := calls(rt, "harvest_claim_step")-steps0, calls(rt, "harvest_claim_bulk")-bulk0
		sameResults(rt, single.singles(rt, req, n), got)
		require.Equal(rt, single.quotaState(rt), batch.quotaState(rt))
		var refused, quotaRows bool
		for _, r := range got {
			refused = refused || (r.OK && len(r.Refused) > 0)
			quotaRows = quotaRows || (r.OK && r.Task.QuotaKey != "")
		}
		if refused && quotaRows && steps <= 1 && bulk <= 2 {
			inBulk++
		}
	})
	t.Logf("batches that took quota rows, reported refusals and stayed in bulk: %d", inBulk)
	require.Positive(t, inBulk, "no batch that took quota rows and reported refusals stayed in bulk")
}
