package runstore

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
)

// progress is a run's progress as a reader sees it.
type progress struct {
	Status    api.Status
	Attempts  int
	ClaimedAt *time.Time
}

// seen reads the run through every reader of this package (Get, Existing,
// the listing, the listing filtered by the status Get shows) and requires
// that they agree; it returns what they show.
func (b bundle) seen(t *testing.T, tenant, id string) progress {
	t.Helper()
	run, err := Get(b.ctx, b.db, tenant, id, 1)
	require.NoError(t, err)
	// A start sent again with this id is answered with the run as it
	// shows (a conflict here: the request differs from the run's).
	again, found, err := Existing(b.ctx, b.db, []StartParams{{Tenant: tenant, Shard: 1, Req: api.StartRequest{ID: id}}})
	require.NoError(t, err)
	require.Equal(t, []bool{true}, found)
	require.Equal(t, run, again[0].Result.Run, "Get and Existing")
	listed := b.listed(t, tenant, run.Status)
	require.Contains(t, listed, id, "the listing under status %s", run.Status)
	for _, st := range []api.Status{api.StatusQueued, api.StatusRunning} {
		if st != run.Status {
			require.NotContains(t, b.listed(t, tenant, st), id, "the listing under status %s", st)
		}
	}
	p := progress{Status: run.Status, Attempts: run.Attempts}
	if run.ClaimedAt != nil {
		at := run.ClaimedAt.Time
		p.ClaimedAt = &at
	}
	return p
}

// listed is the ids of the tenant's runs the listing shows under status.
func (b bundle) listed(t *testing.T, tenant string, status api.Status) []string {
	t.Helper()
	page, err := List(b.ctx, b.db, ListParams{Tenant: tenant, Shard: 1, Statuses: []api.Status{status}, Limit: 100})
	require.NoError(t, err)
	ids := make([]string, len(page.Runs))
	for i, r := range page.Runs {
		ids[i] = r.ID
		require.Equal(t, status, r.Status, "run %s listed under %s", r.ID, status)
	}
	return ids
}

// claimOne claims the one task of queue q.
func (b bundle) claimOne(t *testing.T, q string) claim.Result {
	t.Helper()
	got, err := claim.Claim(b.ctx, b.db, claim.Request{Queue: q, Worker: "w"})
	require.NoError(t, err)
	require.True(t, got.OK, "a task of %s to claim", q)
	return got
}

// taskClaimedAt is the claim stamp of task id.
func (b bundle) taskClaimedAt(t *testing.T, id int64) time.Time {
	t.Helper()
	var at time.Time
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT claimed_at FROM tasks WHERE id = $1`, id).Scan(&at))
	return at
}

// The claim writes only its task (pkg/claim checks that the run row is not
// written): while the task runs, every read of the run shows it running,
// with the attempt in flight counted and its claim time as the run's
// first, and the listing's status filters follow what a read shows (a
// run whose task runs is listed under running, never under queued). Each
// way an attempt ends then leaves the count a user expects: a retry keeps
// the attempt, a release takes it back, an expired lease keeps it, and
// the next claim adds one again.
func TestRunShowsTheAttemptInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res, err := b.start(t, startOpts{Tenant: "acme", Queue: "prog"})
	require.NoError(t, err)
	id := res.Run.ID
	require.Equal(t, progress{Status: api.StatusQueued}, b.seen(t, "acme", id))

	first := b.claimOne(t, "prog")
	firstAt := b.taskClaimedAt(t, first.Task.ID)
	require.Equal(t, progress{Status: api.StatusRunning, Attempts: 1, ClaimedAt: &firstAt}, b.seen(t, "acme", id),
		"while the first attempt runs")

	// A retry: the attempt ended and is kept; the run waits again.
	retried, err := claim.Fail(b.ctx, b.db, first.Task.ID, first.Task.LeaseToken, claim.FailOptions{Error: "boom", RetryAt: time.Now().Add(-time.Hour)})
	require.NoError(t, err)
	require.True(t, retried)
	require.Equal(t, progress{Status: api.StatusQueued, Attempts: 1, ClaimedAt: &firstAt}, b.seen(t, "acme", id),
		"after a retry")

	// The second attempt, then a release: the released attempt is not
	// counted.
	second := b.claimOne(t, "prog")
	require.Equal(t, progress{Status: api.StatusRunning, Attempts: 2, ClaimedAt: &firstAt}, b.seen(t, "acme", id),
		"while the second attempt runs")
	got, err := claim.RecordOutcomes(b.ctx, b.db, time.Time{}, []claim.Outcome{
		{Kind: claim.OutcomeRelease, ID: second.Task.ID, Token: second.Task.LeaseToken}})
	require.NoError(t, err)
	require.NoError(t, got[0].Err)
	require.Equal(t, progress{Status: api.StatusQueued, Attempts: 1, ClaimedAt: &firstAt}, b.seen(t, "acme", id),
		"after a release")

	// An expired lease: the attempt is counted and the run waits again.
	third := b.claimOne(t, "prog")
	require.Equal(t, 2, b.seen(t, "acme", id).Attempts)
	_, err = b.db.Exec(b.ctx, `UPDATE tasks SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, third.Task.ID)
	require.NoError(t, err)
	rescued, err := claim.RescueExpired(b.ctx, b.db, 10)
	require.NoError(t, err)
	require.Equal(t, 1, rescued.Requeued)
	require.Equal(t, progress{Status: api.StatusQueued, Attempts: 2, ClaimedAt: &firstAt}, b.seen(t, "acme", id),
		"after a rescue")

	// The last attempt completes the run: what it shows is stored.
	last := b.claimOne(t, "prog")
	require.Equal(t, progress{Status: api.StatusRunning, Attempts: 3, ClaimedAt: &firstAt}, b.seen(t, "acme", id))
	require.NoError(t, claim.Complete(b.ctx, b.db, last.Task.ID, last.Task.LeaseToken, json.RawMessage(`{}`)))
	done := b.seen(t, "acme", id)
	require.Equal(t, progress{Status: api.StatusCompleted, Attempts: 3, ClaimedAt: &firstAt}, done)
	var stored progress
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT status, attempts, claimed_at FROM runs WHERE tenant = 'acme' AND id = $1`, id).
		Scan(&stored.Status, &stored.Attempts, &stored.ClaimedAt))
	require.Equal(t, done, stored, "a final run shows what is stored")
}

// A run of three steps: it shows running from its first claim to its end,
// between the steps too; each step's attempt counts once; and its
// claimed_at is its first step's claim, not a later step's.
func TestContinuedRunKeepsItsFirstClaim(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res, err := b.start(t, startOpts{Tenant: "acme", Queue: "steps"})
	require.NoError(t, err)
	id := res.Run.ID

	var firstAt time.Time
	for step := range 3 {
		got := b.claimOne(t, "steps")
		require.Equal(t, step, got.Task.Step)
		require.Equal(t, "running", got.Task.RunStatus, "the claim hands the worker a running run")
		if step == 0 {
			firstAt = b.taskClaimedAt(t, got.Task.ID)
		}
		require.Equal(t, progress{Status: api.StatusRunning, Attempts: step + 1, ClaimedAt: &firstAt},
			b.seen(t, "acme", id), "step %d running", step)
		if step < 2 {
			_, err := claim.Continue(b.ctx, b.db, got.Task.ID, got.Task.LeaseToken, claim.ContinueOptions{})
			require.NoError(t, err)
			require.Equal(t, progress{Status: api.StatusRunning, Attempts: step + 1, ClaimedAt: &firstAt},
				b.seen(t, "acme", id), "between step %d and the next", step)
			continue
		}
		require.NoError(t, claim.Complete(b.ctx, b.db, got.Task.ID, got.Task.LeaseToken, nil))
	}
	require.Equal(t, progress{Status: api.StatusCompleted, Attempts: 3, ClaimedAt: &firstAt}, b.seen(t, "acme", id))
}

// A run cancelled while its task runs keeps that attempt: the cancel takes
// the task out of the worker's hands and counts its attempt, which the
// claim no longer did; the run shows cancelled with the attempt and the
// claim time, and a run cancelled before any claim shows none.
func TestCancelCountsTheAttemptItTakesOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res, err := b.start(t, startOpts{Tenant: "acme", Queue: "cancel-q"})
	require.NoError(t, err)
	got := b.claimOne(t, "cancel-q")
	at := b.taskClaimedAt(t, got.Task.ID)
	c, err := Cancel(b.ctx, b.db, "acme", res.Run.ID, 1, "stop")
	require.NoError(t, err)
	require.True(t, c.WasRunning)
	require.Equal(t, api.StatusCancelled, c.Run.Status)
	require.Equal(t, 1, c.Run.Attempts)
	require.NotNil(t, c.Run.ClaimedAt)
	require.True(t, at.Equal(c.Run.ClaimedAt.Time))
	run, err := Get(b.ctx, b.db, "acme", res.Run.ID, 1)
	require.NoError(t, err)
	require.Equal(t, c.Run, run)

	idle, err := b.start(t, startOpts{Tenant: "acme", Queue: "cancel-idle"})
	require.NoError(t, err)
	c, err = Cancel(b.ctx, b.db, "acme", idle.Run.ID, 1, "stop")
	require.NoError(t, err)
	require.False(t, c.WasRunning)
	require.Zero(t, c.Run.Attempts)
	require.Nil(t, c.Run.ClaimedAt)
}

// Waiting explains a queued run only: a run whose task a worker holds is
// running, though its stored status is still queued.
func TestWaitingIsNilWhileTheTaskRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res, err := b.start(t, startOpts{Tenant: "acme", Queue: "wait-q"})
	require.NoError(t, err)
	w, err := Waiting(b.ctx, b.db, "acme", res.Run.ID)
	require.NoError(t, err)
	require.NotNil(t, w, "a queued run waits")
	b.claimOne(t, "wait-q")
	w, err = Waiting(b.ctx, b.db, "acme", res.Run.ID)
	require.NoError(t, err)
	require.Nil(t, w, "a running run does not wait")
}

// A lease that expires on the run's last attempt fails the run, and that
// attempt counts, with the run's first claim time, as a completion's
// would.
func TestExpiredLastAttemptCounts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	res, err := b.start(t, startOpts{Tenant: "acme", Queue: "expire-q"})
	require.NoError(t, err)
	_, err = b.db.Exec(b.ctx, `UPDATE runs SET max_attempts = 1 WHERE tenant = 'acme' AND id = $1`, res.Run.ID)
	require.NoError(t, err)
	got := b.claimOne(t, "expire-q")
	at := b.taskClaimedAt(t, got.Task.ID)
	_, err = b.db.Exec(b.ctx, `UPDATE tasks SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, got.Task.ID)
	require.NoError(t, err)
	rescued, err := claim.RescueExpired(b.ctx, b.db, 10)
	require.NoError(t, err)
	require.Equal(t, 1, rescued.Failed)
	require.Equal(t, progress{Status: api.StatusFailed, Attempts: 1, ClaimedAt: &at}, b.seen(t, "acme", res.Run.ID))
}
