package claim_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
)

// sqlReleaseOne is the statement a worker handed a task back with before
// releases were batched: the reference the batch's release is held to.
const sqlReleaseOne = `
WITH t AS (
    UPDATE tasks SET state = 'pending', attempt = greatest(attempt - 1, 0),
                     lease_token = NULL, lease_expires_at = NULL, claimed_by = NULL
    WHERE id = $1 AND state = 'running' AND lease_token = $2
    RETURNING run_pk
), r AS (
    UPDATE runs SET status = 'queued', attempts = greatest(attempts - 1, 0)
    WHERE pk IN (SELECT run_pk FROM t) AND status = 'running'
    RETURNING pk
)
SELECT count(*) FROM t`

// outcomeSnap is what an outcome leaves of a task, its run (as a user
// sees it: runs_seen), its tenant's count and the continuation it
// enqueued, with ids and tokens reduced to what must agree between two
// twins.
type outcomeSnap struct {
	State, RunStatus              string
	Attempt, RunAttempts, Running int
	HasToken, HasExpiry, HasClaim bool
	DueAt                         time.Time
	Output, Error                 *string
	Finished                      bool
	Next                          *nextSnap
}

type nextSnap struct {
	State, Queue, Key, Quota string
	Priority, Step           int
	Continuation             bool
	Input                    *string
	Sticky                   *string
	StickyUntil              *time.Time
	DueAt                    time.Time
}

func (b *bundle) outcomeSnap(id int64, tenant string) outcomeSnap {
	b.t.Helper()
	var s outcomeSnap
	require.NoError(b.t, b.db.QueryRow(b.ctx, `
		SELECT t.state, t.attempt, t.lease_token IS NOT NULL, t.lease_expires_at IS NOT NULL, t.claimed_by IS NOT NULL,
		       t.due_at, r.status, r.attempts, r.output::text, r.error, r.finished_at IS NOT NULL,
		       coalesce((SELECT c.running FROM tenant_running c WHERE c.tenant = r.tenant), 0)
		FROM tasks t JOIN runs_seen r ON r.pk = t.run_pk WHERE t.id = $1`, id).
		Scan(&s.State, &s.Attempt, &s.HasToken, &s.HasExpiry, &s.HasClaim, &s.DueAt, &s.RunStatus, &s.RunAttempts,
			&s.Output, &s.Error, &s.Finished, &s.Running))
	var n nextSnap
	err := b.db.QueryRow(b.ctx, `
		SELECT x.state, x.queue, x.fairness_key, x.quota_key, x.priority, x.step, x.continuation, x.input::text,
		       x.sticky_worker, x.sticky_until, x.due_at
		FROM tasks t JOIN tasks x ON x.run_pk = t.run_pk AND x.id > t.id WHERE t.id = $1`, id).
		Scan(&n.State, &n.Queue, &n.Key, &n.Quota, &n.Priority, &n.Step, &n.Continuation, &n.Input, &n.Sticky,
			&n.StickyUntil, &n.DueAt)
	if err == nil {
		s.Next = &n
	} else {
		require.ErrorIs(b.t, err, pgx.ErrNoRows)
	}
	return s
}

// An outcome recorded in a batch ends exactly as the same outcome recorded
// alone: for every kind (and the stale and unknown cases), twin tasks get
// one through a single statement and one through one batch holding all of
// them, and their tasks, runs, counts and continuations must agree, with
// what each kind is meant to do.
func TestOutcomeBatchMatchesSingleStatements(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := time.Now().UTC().Truncate(time.Microsecond)
	sticky := now.Add(time.Minute)
	type want struct {
		state, run string
		retried    bool
		next       string // the continuation's state, "" for none
		countDrop  int    // how much the outcome lowers the tenant's count
		event      bool   // the run is returned as made final
		err        error
	}
	cases := []struct {
		name     string
		attempts int            // max_attempts of the run (0: 3)
		prep     func(id int64) // before the outcome: cancel, steal the lease
		out      claim.Outcome  // ID and Token are the twin's
		single   func(id int64, tok uuid.UUID) (bool, error)
		want     want
	}{
		{
			name: "complete",
			out:  claim.Outcome{Kind: claim.OutcomeComplete, Output: json.RawMessage(`{"n":1}`)},
			single: func(id int64, tok uuid.UUID) (bool, error) {
				return false, claim.Complete(b.ctx, b.db, id, tok, json.RawMessage(`{"n":1}`))
			},
			want: want{state: "done", run: "completed", countDrop: 1, event: true},
		},
		{
			// A run whose start did not ask to be announced ends the same
			// way, and is not returned for an event.
			name: "complete of a run not announced",
			prep: func(id int64) {
				_, err := b.db.Exec(b.ctx, `UPDATE runs SET notify = false WHERE pk = (SELECT run_pk FROM tasks WHERE id = $1)`, id)
				require.NoError(t, err)
			},
			out: claim.Outcome{Kind: claim.OutcomeComplete, Output: json.RawMessage(`{"n":1}`)},
			single: func(id int64, tok uuid.UUID) (bool, error) {
				return false, claim.Complete(b.ctx, b.db, id, tok, json.RawMessage(`{"n":1}`))
			},
			want: want{state: "done", run: "completed", countDrop: 1},
		},
		{
			name: "continue",
			out:  claim.Outcome{Kind: claim.OutcomeContinue, Continue: claim.ContinueOptions{Input: json.RawMessage(`{"step":2}`)}},
			single: func(id int64, tok uuid.UUID) (bool, error) {
				_, err := claim.Continue(b.ctx, b.db, id, tok, claim.ContinueOptions{Input: json.RawMessage(`{"step":2}`), Now: now})
				return false, err
			},
			want: want{state: "done", run: "running", next: "pending"},
		},
		{
			name: "continue sticky",
			out:  claim.Outcome{Kind: claim.OutcomeContinue, Continue: claim.ContinueOptions{StickyUntil: sticky}},
			single: func(id int64, tok uuid.UUID) (bool, error) {
				_, err := claim.Continue(b.ctx, b.db, id, tok, claim.ContinueOptions{StickyUntil: sticky, Now: now})
				return false, err
			},
			want: want{state: "done", run: "running", next: "pending"},
		},
		{
			name: "continue delayed and sticky",
			out: claim.Outcome{Kind: claim.OutcomeContinue,
				Continue: claim.ContinueOptions{Delay: time.Hour, StickyUntil: sticky}},
			single: func(id int64, tok uuid.UUID) (bool, error) {
				_, err := claim.Continue(b.ctx, b.db, id, tok, claim.ContinueOptions{Delay: time.Hour, StickyUntil: sticky, Now: now})
				return false, err
			},
			want: want{state: "done", run: "running", next: "scheduled"},
		},
		{
			name: "fail and retry later",
			out:  claim.Outcome{Kind: claim.OutcomeFail, Fail: claim.FailOptions{Error: "boom", RetryAt: now.Add(time.Hour)}},
			single: func(id int64, tok uuid.UUID) (bool, error) {
				return claim.Fail(b.ctx, b.db, id, tok, claim.FailOptions{Error: "boom", RetryAt: now.Add(time.Hour), Now: now})
			},
			want: want{state: "scheduled", run: "queued", retried: true},
		},
		{
			name: "fail and retry now",
			out:  claim.Outcome{Kind: claim.OutcomeFail, Fail: claim.FailOptions{Error: "boom", RetryAt: now.Add(-time.Second)}},
			single: func(id int64, tok uuid.UUID) (bool, error) {
				return claim.Fail(b.ctx, b.db, id, tok, claim.FailOptions{Error: "boom", RetryAt: now.Add(-time.Second), Now: now})
			},
			want: want{state: "pending", run: "queued", retried: true},
		},
		{
			name: "fail permanently",
			out:  claim.Outcome{Kind: claim.OutcomeFail, Fail: claim.FailOptions{Error: "bad input"}},
			single: func(id int64, tok uuid.UUID) (bool, error) {
				return claim.Fail(b.ctx, b.db, id, tok, claim.FailOptions{Error: "bad input", Now: now})
			},
			want: want{state: "done", run: "failed", countDrop: 1, event: true},
		},
		{
			name:     "fail at max attempts",
			attempts: 1,
			out:      claim.Outcome{Kind: claim.OutcomeFail, Fail: claim.FailOptions{Error: "boom", RetryAt: now}},
			single: func(id int64, tok uuid.UUID) (bool, error) {
				return claim.Fail(b.ctx, b.db, id, tok, claim.FailOptions{Error: "boom", RetryAt: now, Now: now})
			},
			want: want{state: "done", run: "failed", countDrop: 1, event: true},
		},
		{
			name: "release",
			out:  claim.Outcome{Kind: claim.OutcomeRelease},
			single: func(id int64, tok uuid.UUID) (bool, error) {
				var n int
				err := b.db.QueryRow(b.ctx, sqlReleaseOne, id, tok).Scan(&n)
				if err == nil && n != 1 {
					err = fmt.Errorf("released %d tasks", n)
				}
				return false, err
			},
			want: want{state: "pending", run: "queued"},
		},
		{
			// A cancelled run's task is retired: done, the run as the
			// cancel left it.
			name: "retire of a cancelled run",
			prep: func(id int64) {
				b.exec(`SELECT harvest_run_finish(run_pk, 'cancelled', NULL, 'cancelled by test') FROM tasks WHERE id = $1`, id)
			},
			out: claim.Outcome{Kind: claim.OutcomeComplete},
			single: func(id int64, tok uuid.UUID) (bool, error) {
				return false, claim.Complete(b.ctx, b.db, id, tok, nil)
			},
			want: want{state: "done", run: "cancelled"},
		},
		{
			name: "stale token",
			prep: func(id int64) { b.exec(`UPDATE tasks SET lease_token = gen_random_uuid() WHERE id = $1`, id) },
			out:  claim.Outcome{Kind: claim.OutcomeFail, Fail: claim.FailOptions{Error: "late"}},
			single: func(id int64, tok uuid.UUID) (bool, error) {
				return claim.Fail(b.ctx, b.db, id, tok, claim.FailOptions{Error: "late", Now: now})
			},
			want: want{state: "running", run: "running", err: claim.ErrStaleLease},
		},
	}

	type twin struct {
		id      int64
		tok     uuid.UUID
		tenant  string
		running int // the tenant's count before the outcome
	}
	lease := func(name, side string, attempts int) twin {
		tenant := name + "/" + side
		run := b.run(runOpts{Tenant: tenant, MaxAttempts: attempts}) // 0: the factory's 3
		id := b.task(taskOpts{RunPK: run, Key: "k", QuotaKey: "qk", Priority: 2})
		res, err := claim.ClaimByID(b.ctx, b.db, id, claim.Request{Queue: "q", Worker: "w", Lease: time.Hour})
		require.NoError(t, err)
		require.True(t, res.OK, name)
		return twin{id: id, tok: res.Task.LeaseToken, tenant: tenant}
	}
	singles := make([]twin, len(cases))
	batched := make([]twin, len(cases))
	outs := make([]claim.Outcome, 0, len(cases)+1)
	for i, c := range cases {
		singles[i], batched[i] = lease(c.name, "single", c.attempts), lease(c.name, "batch", c.attempts)
		for _, tw := range []*twin{&singles[i], &batched[i]} {
			if c.prep != nil {
				c.prep(tw.id)
			}
			tw.running = b.outcomeSnap(tw.id, tw.tenant).Running
		}
		o := c.out
		o.ID, o.Token = batched[i].id, batched[i].tok
		outs = append(outs, o)
	}
	outs = append(outs, claim.Outcome{Kind: claim.OutcomeComplete, ID: 1 << 40, Token: uuid.New()})

	got, err := claim.RecordOutcomes(b.ctx, b.db, now, outs)
	require.NoError(t, err)
	require.Len(t, got, len(outs))
	require.ErrorIs(t, got[len(cases)].Err, claim.ErrNotFound, "unknown id")
	_, err = claim.Fail(b.ctx, b.db, 1<<40, uuid.New(), claim.FailOptions{Error: "x"})
	require.ErrorIs(t, err, claim.ErrNotFound, "unknown id, alone")

	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			retried, serr := c.single(singles[i].id, singles[i].tok)
			if c.want.err != nil {
				require.ErrorIs(t, serr, c.want.err)
				require.ErrorIs(t, got[i].Err, c.want.err)
			} else {
				require.NoError(t, serr)
				require.NoError(t, got[i].Err)
			}
			require.Equal(t, retried, got[i].Retried, "retried alone and in the batch")
			require.Equal(t, c.want.retried, got[i].Retried)
			require.Equal(t, c.want.next != "", got[i].NextID != 0, "a continuation's id is returned")

			one := b.outcomeSnap(singles[i].id, singles[i].tenant)
			many := b.outcomeSnap(batched[i].id, batched[i].tenant)
			// Due times differ between the twins unless the outcome set
			// them (a retry): they were enqueued one after the other.
			if !c.want.retried {
				one.DueAt, many.DueAt = time.Time{}, time.Time{}
			}
			require.Equal(t, one, many, "the same outcome alone and in a batch")

			require.Equal(t, c.want.state, many.State)
			require.Equal(t, c.want.run, many.RunStatus)
			require.Equal(t, batched[i].running-c.want.countDrop, many.Running, "the tenant's count")
			if c.want.next == "" {
				require.Nil(t, many.Next)
			} else {
				require.NotNil(t, many.Next)
				require.Equal(t, c.want.next, many.Next.State)
				require.Equal(t, got[i].NextID, b.nextID(batched[i].id))
				require.True(t, many.Next.Continuation)
				require.Equal(t, 1, many.Next.Step)
				require.Equal(t, []any{"q", "k", "qk", 2}, []any{many.Next.Queue, many.Next.Key, many.Next.Quota, many.Next.Priority})
				if o := c.out.Continue; !o.StickyUntil.IsZero() {
					require.Equal(t, "w", *many.Next.Sticky)
					require.True(t, sticky.Equal(*many.Next.StickyUntil))
				}
				if c.out.Continue.Delay > 0 {
					require.True(t, now.Add(time.Hour).Equal(many.Next.DueAt), "due %s", many.Next.DueAt)
				}
			}
			// The claim counted nothing in the run: the outcome counts the
			// attempt that ended, once; a release counts none; a stale
			// outcome leaves the attempt in flight, which the run shows;
			// the cancel made by hand (harvest_run_finish alone, with no
			// task taken out) counted none.
			wantAttempts := 1
			if c.out.Kind == claim.OutcomeRelease || c.name == "retire of a cancelled run" {
				wantAttempts = 0
			}
			require.Equal(t, wantAttempts, many.RunAttempts, "the run's attempts")
			switch c.out.Kind {
			case claim.OutcomeRelease:
				require.Zero(t, many.Attempt, "a released attempt does not count")
				require.Zero(t, many.RunAttempts)
				require.False(t, many.HasToken || many.HasExpiry || many.HasClaim)
			case claim.OutcomeFail:
				if c.want.retried {
					require.True(t, c.out.Fail.RetryAt.Equal(many.DueAt))
					require.False(t, many.HasToken || many.HasExpiry || many.HasClaim)
				}
				if c.want.err == nil {
					require.Equal(t, c.out.Fail.Error, *many.Error)
				}
			}
			if c.want.event {
				r := got[i].Run
				require.NotNil(t, r, "the run made final is returned")
				require.Equal(t, batched[i].tenant, r.Tenant)
				require.Equal(t, api.Status(c.want.run), r.Status)
				require.Equal(t, "wf", r.Name)
				require.Equal(t, "q", r.Queue)
				require.Equal(t, 1, r.Attempts)
				require.NotNil(t, r.FinishedAt)
				require.NotNil(t, r.ClaimedAt)
				require.False(t, r.CreatedAt.IsZero())
				var id string
				require.NoError(t, b.db.QueryRow(b.ctx, `SELECT r.id FROM runs r JOIN tasks t ON t.run_pk = r.pk WHERE t.id = $1`, batched[i].id).Scan(&id))
				require.Equal(t, id, r.ID)
				if c.out.Kind == claim.OutcomeComplete {
					require.JSONEq(t, string(c.out.Output), string(r.Output))
					require.Nil(t, r.Error)
				} else {
					require.Equal(t, c.out.Fail.Error, *r.Error)
				}
			} else {
				require.Nil(t, got[i].Run, "the run did not become final here, or is not announced")
			}
		})
	}
}

func (b *bundle) nextID(id int64) int64 {
	b.t.Helper()
	var n int64
	require.NoError(b.t, b.db.QueryRow(b.ctx, `SELECT x.id FROM tasks t JOIN tasks x ON x.run_pk = t.run_pk AND x.id > t.id WHERE t.id = $1`, id).Scan(&n))
	return n
}

// A task named twice in one batch is recorded once, by its first outcome.
func TestOutcomeBatchRecordsATaskOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tk := leased(b, "k")
	var before int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT running FROM tenant_running WHERE tenant = 't1'`).Scan(&before))
	got, err := claim.RecordOutcomes(b.ctx, b.db, time.Time{}, []claim.Outcome{
		{Kind: claim.OutcomeComplete, ID: tk.ID, Token: tk.LeaseToken},
		{Kind: claim.OutcomeFail, ID: tk.ID, Token: tk.LeaseToken, Fail: claim.FailOptions{Error: "x"}},
	})
	require.NoError(t, err)
	require.NoError(t, got[0].Err)
	require.ErrorIs(t, got[1].Err, claim.ErrStaleLease)
	require.Equal(t, "completed", b.row(tk.ID).RunState)
	var after int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT running FROM tenant_running WHERE tenant = 't1'`).Scan(&after))
	require.Equal(t, before-1, after, "counted once")
}

// Delays and sticky windows given as durations count from the database
// clock (or the batch's now), as a worker sends them.
func TestOutcomeBatchCountsDelaysFromTheDatabaseClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	retry, cont := leased(b, "k"), leased(b, "k")
	var dbNow time.Time
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT now()`).Scan(&dbNow))
	got, err := claim.RecordOutcomes(b.ctx, b.db, time.Time{}, []claim.Outcome{
		{Kind: claim.OutcomeFail, ID: retry.ID, Token: retry.LeaseToken, Fail: claim.FailOptions{Error: "x", RetryAfter: time.Hour}},
		{Kind: claim.OutcomeContinue, ID: cont.ID, Token: cont.LeaseToken,
			Continue: claim.ContinueOptions{Delay: 2 * time.Hour, StickyFor: 3 * time.Hour}},
	})
	require.NoError(t, err)
	require.NoError(t, got[0].Err)
	require.NoError(t, got[1].Err)
	require.True(t, got[0].Retried)
	var after time.Time
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT now()`).Scan(&after))
	within := func(what string, at time.Time, d time.Duration) {
		require.False(t, at.Before(dbNow.Add(d)), "%s: %s is before %s", what, at, dbNow.Add(d))
		require.False(t, at.After(after.Add(d)), "%s: %s is after %s", what, at, after.Add(d))
	}
	r := b.row(retry.ID)
	require.Equal(t, "scheduled", r.State)
	within("retry", r.DueAt, time.Hour)
	var (
		due, until time.Time
		state      string
		worker     string
	)
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT state, due_at, sticky_until, sticky_worker FROM tasks WHERE id = $1`,
		got[1].NextID).Scan(&state, &due, &until, &worker))
	require.Equal(t, "scheduled", state)
	within("continuation due", due, 2*time.Hour)
	within("sticky end", until, 3*time.Hour)
	require.Equal(t, "w1", worker)
}
