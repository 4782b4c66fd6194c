package runstore

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// failRun starts a run, claims its task and fails it for good; it returns
// the run's id.
func (b bundle) failRun(t *testing.T, tenant string) string {
	t.Helper()
	res, err := b.start(t, startOpts{Tenant: tenant, Queue: "retry-q-" + tenant, Input: `{"step":"one"}`})
	require.NoError(t, err)
	got, err := claim.Claim(b.ctx, b.db, claim.Request{Queue: "retry-q-" + tenant})
	require.NoError(t, err)
	require.True(t, got.OK)
	require.Equal(t, res.TaskID, got.Task.ID)
	retried, err := claim.Fail(b.ctx, b.db, got.Task.ID, got.Task.LeaseToken, claim.FailOptions{Error: "boom"})
	require.NoError(t, err)
	require.False(t, retried)
	return res.Run.ID
}

func (b bundle) retry(t *testing.T, tenant, id string, adm tenantcap.Hook) (RetryResult, error) {
	t.Helper()
	return Retry(b.ctx, b.db, RetryParams{Tenant: tenant, ID: id, Shard: 1, Actor: "tester", Admitter: adm})
}

// A failed run goes back to queued with its attempts kept, a new task
// repeats its last one (claimable, with a fresh attempt budget), the
// tenant's count grows by one and is what the admitter was shown, and the
// audit row names the actor.
func TestRetryPutsAFailedRunBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.failRun(t, "acme")
	require.Zero(t, b.running(t, "acme"))

	rec := &recorder{}
	res, err := b.retry(t, "acme", id, rec)
	require.NoError(t, err)
	require.Equal(t, api.StatusQueued, res.Run.Status)
	require.Equal(t, 1, res.Run.Attempts, "the first attempt is kept")
	require.Nil(t, res.Run.Error)
	require.Nil(t, res.Run.FinishedAt)
	require.Equal(t, 1, b.running(t, "acme"))
	asked := rec.asked()
	require.Len(t, asked, 1)
	require.Equal(t, 1, asked[0].Running)
	require.Equal(t, 1, asked[0].ShardRunning)
	require.Equal(t, id, asked[0].Req.ID)

	got, err := claim.Claim(b.ctx, b.db, claim.Request{Queue: "retry-q-acme"})
	require.NoError(t, err)
	require.True(t, got.OK)
	require.Equal(t, res.TaskID, got.Task.ID)
	require.Equal(t, 1, got.Task.Attempt, "a fresh budget of attempts")
	require.JSONEq(t, `{"step":"one"}`, string(got.Task.Input))
	require.NoError(t, claim.Complete(b.ctx, b.db, got.Task.ID, got.Task.LeaseToken, json.RawMessage(`{"ok":true}`)))
	run, _, err := get(b.ctx, b.db, "acme", id, 1)
	require.NoError(t, err)
	require.Equal(t, api.StatusCompleted, run.Status)
	require.Equal(t, 2, run.Attempts, "attempts are counted on from the first")
	require.Zero(t, b.running(t, "acme"))

	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM audit WHERE action = 'run.retry' AND actor = 'tester'
		AND new_value->>'id' = $1 AND old_value->>'status' = 'failed'`, id))
}

// Only failed and cancelled runs that started can be retried; a refusal
// of the admitter leaves nothing behind.
func TestRetryRefusals(t *testing.T) {
	t.Parallel()
	b := setup(t)

	_, err := b.retry(t, "acme", "nope", nil)
	require.ErrorIs(t, err, ErrNotFound)

	queued, err := b.start(t, startOpts{Tenant: "acme", Queue: "other"})
	require.NoError(t, err)
	res, err := b.retry(t, "acme", queued.Run.ID, nil)
	require.ErrorIs(t, err, ErrNotRetryable)
	require.Equal(t, api.StatusQueued, res.Run.Status)
	_, err = b.retry(t, "globex", queued.Run.ID, nil)
	require.ErrorIs(t, err, ErrNotFound, "another tenant's run is not found")

	id := b.failRun(t, "acme")
	tasksBefore := b.count(t, `SELECT count(*) FROM tasks`)
	_, err = b.retry(t, "acme", id, &recorder{refuse: map[string]bool{id: true}})
	var ae *api.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, api.CodeOverLimit, ae.Code)
	run, _, err := get(b.ctx, b.db, "acme", id, 1)
	require.NoError(t, err)
	require.Equal(t, api.StatusFailed, run.Status, "a refused retry changes nothing")
	require.Equal(t, tasksBefore, b.count(t, `SELECT count(*) FROM tasks`))
	require.Equal(t, 1, b.running(t, "acme"), "only the queued run")
	require.Zero(t, b.count(t, `SELECT count(*) FROM audit WHERE action = 'run.retry'`))

	// A cancelled run retries; a run cancelled with no task never started.
	c, err := Cancel(b.ctx, b.db, "acme", queued.Run.ID, 1, "test")
	require.NoError(t, err)
	require.True(t, c.Cancelled)
	res, err = b.retry(t, "acme", queued.Run.ID, nil)
	require.NoError(t, err)
	require.Equal(t, api.StatusQueued, res.Run.Status)
	_, err = b.db.Exec(b.ctx, `INSERT INTO runs (tenant, id, name, queue, request_hash, status, finished_at)
		VALUES ('acme', 'never', 'echo', 'q', '\x00', 'cancelled', now())`)
	require.NoError(t, err)
	res, err = b.retry(t, "acme", "never", nil)
	require.ErrorIs(t, err, ErrNotRetryable)
	require.Equal(t, api.StatusCancelled, res.Run.Status)
}

// A tenant fenced on the shard (it moved away) cannot retry there, and a
// run a move is copying cannot be retried until the copy has it.
func TestRetryDuringAMove(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.failRun(t, "acme")
	_, err := b.db.Exec(b.ctx, `INSERT INTO move_out (run_pk, tenant, moved_to) SELECT pk, tenant, 2 FROM runs WHERE id = $1`, id)
	require.NoError(t, err)
	_, err = b.retry(t, "acme", id, nil)
	require.ErrorIs(t, err, ErrRunMoving)

	_, err = b.db.Exec(b.ctx, `INSERT INTO tenant_fences (tenant, moved_to) VALUES ('acme', 2)`)
	require.NoError(t, err)
	_, err = b.retry(t, "acme", id, nil)
	m := AsMoved(err)
	require.NotNil(t, m, "%v", err)
	require.Equal(t, 2, m.To)
	run, _, err := get(b.ctx, b.db, "acme", id, 1)
	require.NoError(t, err)
	require.Equal(t, api.StatusFailed, run.Status)
}

// Retries racing for one run make it run once more, not once per retry;
// retries racing at the tenant's limit admit exactly up to it, as starts
// do (the tenant's count row serialises them).
func TestRetriesRace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.failRun(t, "acme")
	const racers = 8
	errs := make(chan error, racers)
	for range racers {
		go func() {
			_, err := b.retry(t, "acme", id, nil)
			errs <- err
		}()
	}
	ok := 0
	for range racers {
		err := <-errs
		if err == nil {
			ok++
			continue
		}
		require.ErrorIs(t, err, ErrNotRetryable)
	}
	require.Equal(t, 1, ok)
	require.Equal(t, 1, b.running(t, "acme"))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM tasks t JOIN runs r ON r.pk = t.run_pk WHERE r.id = $1 AND t.state = 'pending'`, id))

	// Ten failed runs of globex, a limit of three unfinished runs.
	var ids []string
	for range 10 {
		ids = append(ids, b.failRun(t, "globex"))
	}
	limit := &recorder{limit: 3}
	for _, id := range ids {
		go func() {
			_, err := b.retry(t, "globex", id, limit)
			errs <- err
		}()
	}
	ok = 0
	for range ids {
		err := <-errs
		if err == nil {
			ok++
			continue
		}
		var ae *api.Error
		require.ErrorAs(t, err, &ae)
		require.Equal(t, api.CodeOverLimit, ae.Code)
	}
	require.Equal(t, 3, ok)
	require.Equal(t, 3, b.running(t, "globex"))
	require.Equal(t, 3, b.count(t, `SELECT count(*) FROM runs WHERE tenant = 'globex' AND status = 'queued'`))
}
