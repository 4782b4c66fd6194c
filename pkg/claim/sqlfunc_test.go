package claim_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/claim"
)

// The claim and outcome statements call no LANGUAGE sql function through
// the executor. The planner inlines an SQL function into its caller only
// when the body is a plain expression (no subquery, no aggregate); any
// other is parsed and planned again by every call site in every
// transaction, a cost that no plan cache keeps. Each SQL helper of these
// paths must therefore be inlined, or be plpgsql (plans kept per session).
// track_functions = 'all' counts exactly the SQL functions that were not
// inlined; the test walks a fair batch claim past a row pinned to its
// worker (the probe harvest_pinned_waiting on every path) and an outcome
// batch with a continuation (harvest_outcome_times).
func TestClaimAndOutcomeRunNoSQLFunctionThroughTheExecutor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for range 4 {
		b.task(taskOpts{Key: "a"})
		b.task(taskOpts{Key: "b"})
	}

	tx, err := b.db.Begin(b.ctx)
	require.NoError(t, err)
	defer tx.Rollback(b.ctx) //nolint:errcheck // the test changes nothing it keeps
	_, err = tx.Exec(b.ctx, `SET LOCAL track_functions = 'all'`)
	require.NoError(t, err)

	req := claim.Request{Queue: "q", Worker: "w1", Fair: true}
	first, err := claim.ClaimBatch(b.ctx, tx, req, 3)
	require.NoError(t, err)
	require.Len(t, first, 3)
	outs := []claim.Outcome{
		{Kind: claim.OutcomeContinue, ID: first[0].Task.ID, Token: first[0].Task.LeaseToken,
			Continue: claim.ContinueOptions{StickyFor: time.Hour}},
		{Kind: claim.OutcomeComplete, ID: first[1].Task.ID, Token: first[1].Task.LeaseToken},
		{Kind: claim.OutcomeFail, ID: first[2].Task.ID, Token: first[2].Task.LeaseToken,
			Fail: claim.FailOptions{Error: "boom", RetryAfter: time.Minute}},
	}
	res, err := claim.RecordOutcomes(b.ctx, tx, time.Time{}, outs)
	require.NoError(t, err)
	for _, r := range res {
		require.NoError(t, r.Err)
	}
	require.NotZero(t, res[0].NextID)
	// The continuation is pinned to w1: this batch takes it by a single
	// step first, then the rest in bulk.
	second, err := claim.ClaimBatch(b.ctx, tx, req, 3)
	require.NoError(t, err)
	require.Len(t, second, 3)
	require.Equal(t, res[0].NextID, second[0].Task.ID, "the pinned continuation comes first")

	// The calls of the transaction's functions in language lang, by name.
	calls := func(lang string) map[string]int64 {
		t.Helper()
		rows, err := tx.Query(b.ctx, `
			SELECT p.proname AS name, sum(pg_stat_get_xact_function_calls(p.oid)) AS calls
			FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
			WHERE l.lanname = $1 AND p.proname LIKE 'harvest\_%'
			  AND pg_stat_get_xact_function_calls(p.oid) > 0
			GROUP BY p.proname`, lang)
		require.NoError(t, err)
		counted, err := pgx.CollectRows(rows, pgx.RowToStructByName[struct {
			Name  string
			Calls int64
		}])
		require.NoError(t, err)
		out := make(map[string]int64, len(counted))
		for _, c := range counted {
			out[c.Name] = c.Calls
		}
		return out
	}
	require.Empty(t, calls("sql"), "SQL functions run by the executor: each is parsed and planned per call site and transaction")
	// The paths ran, and the transaction's counts are visible.
	pl := calls("plpgsql")
	require.Positive(t, pl["harvest_claim_batch"])
	require.Positive(t, pl["harvest_pinned_waiting"], "plpgsql calls: %v", pl)
	require.Positive(t, pl["harvest_outcome_times"], "plpgsql calls: %v", pl)
}
