package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/worker"
)

func batchConfig(c *worker.Config) {
	c.ClaimBatch = 8
	c.MaxConcurrentClaims = 16
	c.BatchClaimers = 1
	c.CompleteBatch = 32
}

// In batch mode every run completes, is announced once, and the tenant's
// count of unfinished runs returns to zero.
func TestBatchModeCompletesAndAnnounces(t *testing.T) {
	t.Parallel()
	const n = 150
	b := setup(t)
	events, err := b.nc.SubscribeSync("harvest.runs.acme.>")
	require.NoError(t, err)
	require.NoError(t, b.nc.Flush())
	ids := map[string]bool{}
	for range n {
		ids[b.start(startOpts{Key: "k", Notify: true}).Run.ID] = true
	}
	r := b.worker(workerOpts{Config: batchConfig})
	b.wake("q")
	for range n {
		f := r.next(t, b.ctx)
		require.Equal(t, worker.OutcomeCompleted, f.Outcome)
		require.NoError(t, f.Err)
	}
	seen := map[string]bool{}
	for range n {
		msg, err := events.NextMsg(time.Minute)
		require.NoError(t, err)
		id := msg.Subject[strings.LastIndex(msg.Subject, ".")+1:]
		require.True(t, ids[id], "event for an unknown run %s", id)
		require.False(t, seen[id], "run %s announced twice", id)
		seen[id] = true
	}
	var completed, running int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM runs WHERE status = $1`, string(api.StatusCompleted)).Scan(&completed))
	require.Equal(t, n, completed)
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT running FROM tenant_running WHERE tenant = 'acme'`).Scan(&running))
	require.Zero(t, running)
	var leased int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM tasks WHERE state <> 'done'`).Scan(&leased))
	require.Zero(t, leased)
}

// A lost lease in batch mode drops the result like the single loop does.
func TestBatchModeDropsAResultWhoseLeaseWasLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	st := b.start(startOpts{Key: "k"})
	release := make(chan struct{})
	r := b.worker(workerOpts{Config: batchConfig, Handlers: map[string]worker.HandlerFunc{
		"echo": func(_ context.Context, tk worker.Task) (worker.Result, error) {
			<-release
			return worker.Complete(tk.Input), nil
		},
	}})
	b.wake("q")
	require.Eventually(t, func() bool {
		var s string
		_ = b.db.QueryRow(b.ctx, `SELECT state FROM tasks LIMIT 1`).Scan(&s)
		return s == "running"
	}, time.Minute, 5*time.Millisecond)
	// Another worker's lease replaces this one.
	_, err := b.db.Exec(b.ctx, `UPDATE tasks SET lease_token = gen_random_uuid()`)
	require.NoError(t, err)
	close(release)
	f := r.next(t, b.ctx)
	require.Equal(t, worker.OutcomeDiscarded, f.Outcome)
	require.Equal(t, api.StatusRunning, b.run("acme", st.Run.ID).Status)
}

// The flood-fairness property holds in batch mode: a light key's task is
// claimed within two batches plus one claim per active key of being added.
func TestBatchModeFloodCannotHoldLightKeys(t *testing.T) {
	t.Parallel()
	const (
		flood     = 10000
		lightKeys = 5
		perKey    = 20
	)
	b := setup(t)
	var n int
	require.NoError(t, b.db.QueryRow(b.ctx, floodSQL, flood).Scan(&n))
	claimedLight := make(chan string, lightKeys*perKey)
	cfg := func(c *worker.Config) {
		batchConfig(c)
		c.FairnessKeys = true
		c.PollInterval = 10 * time.Millisecond
	}
	r := b.worker(workerOpts{
		NoNATS: true,
		Config: cfg,
		Handlers: map[string]worker.HandlerFunc{
			"noop": func(context.Context, worker.Task) (worker.Result, error) { return worker.Complete(nil), nil },
		},
		Hooks: worker.Hooks{Claimed: func(tk worker.Task) {
			if strings.HasPrefix(tk.Key, "light-") {
				claimedLight <- tk.Key
			}
		}},
	})
	added := map[string]int{}
	var ids []int64
	var addedAt []time.Time
	add := func(key string) {
		added[key]++
		var (
			id int64
			at time.Time
		)
		require.NoError(t, b.db.QueryRow(b.ctx, lightSQL, fmt.Sprintf("%s-%d", key, added[key]), key).Scan(&id, &at))
		// Count from after the commit: a commit may take long on a busy
		// machine, and batches claimed meanwhile could not see the task.
		require.NoError(t, b.db.QueryRow(b.ctx, `SELECT clock_timestamp()`).Scan(&at))
		ids = append(ids, id)
		addedAt = append(addedAt, at)
	}
	for k := range lightKeys {
		add(fmt.Sprintf("light-%d", k))
	}
	for claimed := 0; claimed < lightKeys*perKey; claimed++ {
		select {
		case key := <-claimedLight:
			if added[key] < perKey {
				add(key)
			}
		case <-b.ctx.Done():
			t.Fatalf("only %d light tasks were claimed", claimed)
		}
	}
	r.Stop(t)

	// Counted from the commit of the task: the statement in flight then may
	// take a whole batch of the flood; the next one serves the keys without
	// debt first. One more batch of slack for a statement whose snapshot
	// was taken just before the commit.
	var c worker.Config
	cfg(&c)
	bound := 2*c.ClaimBatch*c.BatchClaimers + lightKeys + 1
	rows, err := b.db.Query(b.ctx, `
		SELECT (SELECT count(*) FROM tasks x WHERE x.claimed_at > a.added_at AND x.claimed_at <= l.claimed_at)
		FROM unnest($1::bigint[], $2::timestamptz[]) a(id, added_at) JOIN tasks l ON l.id = a.id
		ORDER BY a.id`, ids, addedAt)
	require.NoError(t, err)
	positions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Len(t, positions, lightKeys*perKey)
	worst := 0
	for i, p := range positions {
		// Zero or less: claimed before the time was read after the commit.
		require.LessOrEqual(t, p, bound, "light task %d was claim number %d after it was added", ids[i], p)
		worst = max(worst, p)
	}
	t.Logf("worst light-task position: %d (bound %d)", worst, bound)
	var floodDone int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM tasks WHERE fairness_key = 'flood' AND state <> 'pending'`).Scan(&floodDone))
	require.Less(t, floodDone, flood, "the flood was still backlogged when the light keys finished")
	var stillRunning int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM tasks WHERE state = 'running'`).Scan(&stillRunning))
	require.Zero(t, stillRunning)
}

// In batch mode a continuation due at once is claimed as soon as its step
// is recorded, not at the next poll: every claim loop has long gone to wait
// (each handler returns only after the loop that claimed its task
// reported an empty claim), and the poll is an hour. With one claim loop,
// the default, and with 16.
func TestBatchModeClaimsAContinuationWithoutAPoll(t *testing.T) {
	t.Parallel()
	for _, loops := range []int{1, 16} {
		t.Run(fmt.Sprintf("claimers=%d", loops), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var r *running
			r = b.worker(workerOpts{Config: func(c *worker.Config) {
				batchConfig(c)
				c.BatchClaimers = loops
			}, Handlers: map[string]worker.HandlerFunc{
				"steps": func(ctx context.Context, tk worker.Task) (worker.Result, error) {
					select {
					case <-r.Idle:
					case <-ctx.Done():
						return worker.Result{}, ctx.Err()
					}
					if tk.Step < 2 {
						return worker.Continue(json.RawMessage(`{}`)), nil
					}
					return worker.Complete(tk.Input), nil
				},
			}})
			r.waitIdle(t, b.ctx, loops) // every loop's first claim found nothing
			st := b.start(startOpts{Name: "steps"})
			b.wake("q")
			ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
			defer cancel()
			for step, want := range []worker.Outcome{worker.OutcomeContinued, worker.OutcomeContinued, worker.OutcomeCompleted} {
				f := r.next(t, ctx)
				require.Equal(t, want, f.Outcome, "step %d", step)
				require.Equal(t, step, f.Task.Step)
			}
			require.Equal(t, api.StatusCompleted, b.run("acme", st.Run.ID).Status)
		})
	}
}

// BenchmarkQuietWorkflowSteps times a three-step run (two continuations)
// from its start to its completion on an otherwise idle worker with the
// shipped claim settings (batch mode, a one-second poll): what a workflow
// waits for between its steps when no other work wakes the claim loop.
func BenchmarkQuietWorkflowSteps(b *testing.B) {
	bd := setup(b)
	r := bd.worker(workerOpts{Config: func(c *worker.Config) {
		d := worker.DefaultConfig()
		c.MaxConcurrentClaims, c.ClaimBatch, c.PollInterval = d.MaxConcurrentClaims, d.ClaimBatch, d.PollInterval
	}, Handlers: map[string]worker.HandlerFunc{
		"steps": func(_ context.Context, tk worker.Task) (worker.Result, error) {
			if tk.Step < 2 {
				return worker.Continue(json.RawMessage(`{}`)), nil
			}
			return worker.Complete(tk.Input), nil
		},
	}})
	for b.Loop() {
		bd.start(startOpts{Name: "steps"})
		bd.wake("q")
		for range 3 {
			r.next(b, bd.ctx)
		}
	}
}
