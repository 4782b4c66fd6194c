package claim_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/claim"
)

// keySummary is a key's summary row as stored.
type keySummary struct {
	Key    string
	HeadID *int64
	InDebt bool
}

func (b *bundle) summaries() []keySummary {
	b.t.Helper()
	rows, err := b.db.Query(b.ctx, `SELECT key, head_id, in_debt FROM fair_state ORDER BY queue, key`)
	require.NoError(b.t, err)
	defer rows.Close()
	var out []keySummary
	for rows.Next() {
		var s keySummary
		require.NoError(b.t, rows.Scan(&s.Key, &s.HeadID, &s.InDebt))
		out = append(out, s)
	}
	require.NoError(b.t, rows.Err())
	return out
}

// A batch whose rows all come from one key (the flood shape) is taken in
// bulk; it must leave what the same number of single claims leave: the same
// rows in the same order, the same lags, charges, summaries and leases.
func TestBulkBatchMatchesSingleClaims(t *testing.T) {
	t.Parallel()
	for _, fair := range []bool{true, false} {
		t.Run(fmt.Sprintf("fair=%v", fair), func(t *testing.T) {
			t.Parallel()
			single, batch := setup(t), setup(t)
			for _, b := range []*bundle{single, batch} {
				b.tasks(3, taskOpts{Key: "light", DueAt: t0})
				b.tasks(12, taskOpts{Key: "flood", DueAt: t0.Add(time.Second)})
				b.exec(`INSERT INTO weight_overrides (queue, key, weight) VALUES ('q', 'flood', 3)`)
			}
			// Drain the light key first so that the flood is the only key
			// with work (the bulk shape), then take it in two batches.
			req := claim.Request{Queue: "q", Worker: "w", Fair: fair, Lease: time.Minute}
			var want, got []claim.Result
			for range 15 {
				want = append(want, single.claim(req))
			}
			for _, n := range []int{5, 7, 6} {
				rs, err := claim.ClaimBatch(batch.ctx, batch.db, req, n)
				require.NoError(t, err)
				got = append(got, rs...)
			}
			require.Len(t, got, 15)
			for i := range want {
				require.True(t, got[i].OK, i)
				require.Equal(t, want[i].Task.ID, got[i].Task.ID, "row %d", i)
				require.Equal(t, want[i].Lag, got[i].Lag, "lag of row %d", i)
				require.Equal(t, want[i].Task.Attempt, got[i].Task.Attempt)
				require.NotEqual(t, uuid.Nil, got[i].Task.LeaseToken)
				require.Equal(t, "running", batch.row(got[i].Task.ID).RunState)
			}
			ws, err := claim.FairState(single.ctx, single.db)
			require.NoError(t, err)
			gs, err := claim.FairState(batch.ctx, batch.db)
			require.NoError(t, err)
			for i := range ws {
				ws[i].ChargedAt, gs[i].ChargedAt = time.Time{}, time.Time{}
			}
			require.Equal(t, ws, gs)
			require.Equal(t, single.summaries(), batch.summaries())
			rs, err := claim.ClaimBatch(batch.ctx, batch.db, req, 4)
			require.NoError(t, err)
			require.Empty(t, rs)
		})
	}
}

// A batch stops its bulk step before a row with a quota key, so that row
// still goes through the rechecks.
func TestBulkBatchLeavesQuotaRowsToRechecks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.tasks(2, taskOpts{Key: "k", DueAt: t0})
	capped := b.tasks(2, taskOpts{Key: "k", QuotaKey: "cap", DueAt: t0.Add(time.Second)})
	b.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent) VALUES ('q', 'cap', 1)`)
	rs, err := claim.ClaimBatch(b.ctx, b.db, claim.Request{Queue: "q", Fair: true}, 10)
	require.NoError(t, err)
	require.Equal(t, []int64{a[0], a[1], capped[0]}, ids(rs))
	last := rs[len(rs)-1]
	require.False(t, last.OK)
	require.Equal(t, claim.EmptyRefused, last.Empty)
	require.Equal(t, capped[1], last.Refused[0].TaskID)
}

// Every completion of a batch is fenced by its own token: stale and unknown
// ones change nothing and do not stop the others.
func TestCompleteBatchFencesEachLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	good := leased(b, "k")
	good2 := leased(b, "k")
	old := leased(b, "k")
	// old's lease expires and another worker takes it again.
	b.exec(`UPDATE tasks SET lease_expires_at = now() - interval '1 s' WHERE id = $1`, old.ID)
	_, err := claim.RescueExpired(b.ctx, b.db, 0)
	require.NoError(t, err)
	again := b.claim(claim.Request{Queue: "q", Worker: "w2", Fair: true, Lease: time.Minute})
	require.Equal(t, old.ID, again.Task.ID)
	beforeOld := b.row(old.ID)
	stateBefore, err := claim.FairState(b.ctx, b.db)
	require.NoError(t, err)
	var runningBefore int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT running FROM tenant_running WHERE tenant = 't1'`).Scan(&runningBefore))

	errs, err := claim.CompleteBatch(b.ctx, b.db, []claim.Completion{
		{ID: good.ID, Token: good.LeaseToken, Output: json.RawMessage(`{"n":1}`)},
		{ID: old.ID, Token: old.LeaseToken, Output: json.RawMessage(`{"n":2}`)},
		{ID: 1 << 40, Token: uuid.New()},
		{ID: good2.ID, Token: good2.LeaseToken},
	})
	require.NoError(t, err)
	require.Len(t, errs, 4)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], claim.ErrStaleLease)
	require.ErrorIs(t, errs[2], claim.ErrNotFound)
	require.NoError(t, errs[3])

	require.Equal(t, beforeOld, b.row(old.ID), "the stale completion changed the task")
	require.Equal(t, "done", b.row(good.ID).State)
	require.Equal(t, "completed", b.row(good.ID).RunState)
	require.Equal(t, "completed", b.row(good2.ID).RunState)
	var out string
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT r.output::text FROM runs r JOIN tasks t ON t.run_pk = r.pk WHERE t.id = $1`, good.ID).Scan(&out))
	require.JSONEq(t, `{"n":1}`, out)
	var running int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT running FROM tenant_running WHERE tenant = 't1'`).Scan(&running))
	require.Equal(t, runningBefore-2, running)
	stateAfter, err := claim.FairState(b.ctx, b.db)
	require.NoError(t, err)
	require.Equal(t, stateBefore, stateAfter)

	// The current holder still completes; the first two are not done twice.
	errs, err = claim.CompleteBatch(b.ctx, b.db, []claim.Completion{
		{ID: old.ID, Token: again.Task.LeaseToken},
		{ID: good.ID, Token: good.LeaseToken},
	})
	require.NoError(t, err)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], claim.ErrStaleLease)
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT running FROM tenant_running WHERE tenant = 't1'`).Scan(&running))
	require.Equal(t, runningBefore-3, running)
}
