package claim_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/claim"
)

// A batch's leases share one random draw (harvest_lease_rows), so each
// lease must still get a token of its own: in one statement, across
// statements and across the bulk plans that lease rows, and a token only
// fences the task it was given for.
func TestBatchLeasesEachRowItsOwnToken(t *testing.T) {
	t.Parallel()
	for _, shape := range []struct {
		name string
		keys []string
		fair bool
	}{
		{"one key, fair", []string{"flood"}, true},
		{"two keys, fair", []string{"a", "b"}, true},
		{"two keys, ordinary", []string{"a", "b"}, false},
	} {
		t.Run(shape.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			for _, k := range shape.keys {
				b.tasks(8, taskOpts{Key: k, DueAt: t0})
			}
			req := claim.Request{Queue: "q", Worker: "w", Fair: shape.fair, Lease: time.Minute}
			var got []claim.Result
			for _, n := range []int{4, 4} {
				rs, err := claim.ClaimBatch(b.ctx, b.db, req, n)
				require.NoError(t, err)
				require.Len(t, rs, n)
				got = append(got, rs...)
			}
			seen := map[uuid.UUID]int64{}
			for _, r := range got {
				require.True(t, r.OK)
				require.NotEqual(t, uuid.Nil, r.Task.LeaseToken)
				other, dup := seen[r.Task.LeaseToken]
				require.False(t, dup, "tasks %d and %d were leased under one token", other, r.Task.ID)
				seen[r.Task.LeaseToken] = r.Task.ID
				require.Equal(t, r.Task.LeaseToken.String(), *b.row(r.Task.ID).Token)
			}

			// The neighbour's token, from the same statement, records nothing.
			first, second := got[0].Task, got[1].Task
			res, err := claim.RecordOutcomes(b.ctx, b.db, time.Time{}, []claim.Outcome{
				{Kind: claim.OutcomeComplete, ID: first.ID, Token: second.LeaseToken},
			})
			require.NoError(t, err)
			require.ErrorIs(t, res[0].Err, claim.ErrStaleLease)
			require.Equal(t, "running", b.row(first.ID).State)

			// Handed back and claimed again, the task gets a token no lease
			// had before.
			res, err = claim.RecordOutcomes(b.ctx, b.db, time.Time{}, []claim.Outcome{
				{Kind: claim.OutcomeRelease, ID: first.ID, Token: first.LeaseToken},
			})
			require.NoError(t, err)
			require.NoError(t, res[0].Err)
			again, err := claim.ClaimBatch(b.ctx, b.db, req, 10)
			require.NoError(t, err)
			var found bool
			for _, r := range again {
				_, dup := seen[r.Task.LeaseToken]
				require.False(t, dup, "task %d leased again under an old token", r.Task.ID)
				found = found || r.Task.ID == first.ID
			}
			require.True(t, found, "the released task was not claimed again")
		})
	}
}
