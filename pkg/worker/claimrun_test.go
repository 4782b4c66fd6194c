package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/worker"
)

// sqlLog records the text of every statement sent on a pool, batched or
// not.
type sqlLog struct {
	mu   sync.Mutex
	sqls []string
}

func (l *sqlLog) add(sql string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sqls = append(l.sqls, sql)
}

func (l *sqlLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.sqls...)
}

func (l *sqlLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.add(d.SQL)
	return ctx
}

func (l *sqlLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *sqlLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (l *sqlLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.add(d.SQL)
}

func (l *sqlLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// loggedPool is a pool on the bundle's database that records every
// statement sent on it.
func (b *bundle) loggedPool(t *testing.T) (*pgxpool.Pool, *sqlLog) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.db.Config().ConnString())
	require.NoError(t, err)
	log := &sqlLog{}
	cfg.ConnConfig.Tracer = log
	db, err := pgxpool.NewWithConfig(b.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	return db, log
}

// readsRuns matches a statement that reads the runs table itself (the
// claim and outcome statements call functions that write it).
var readsRuns = regexp.MustCompile(`(?is)\b(from|join)\s+runs\b`)

// A handler gets its task's run (tenant, id, workflow, max_attempts and
// the run's timeout as the deadline) from the claim statement alone: in
// both claim modes the worker sends no statement that reads the runs. A
// run cancelled before its task was claimed is retired without running its
// handler, from the status the claim returned.
func TestClaimAloneGivesTheHandlerItsRun(t *testing.T) {
	t.Parallel()
	for _, mode := range []struct {
		name string
		cfg  func(*worker.Config)
	}{
		{"single", func(c *worker.Config) { c.FairnessKeys = true }},
		{"batch", func(c *worker.Config) { batchConfig(c); c.FairnessKeys = true }},
	} {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			db, log := b.loggedPool(t)
			type want struct {
				tenant, workflow string
				maxAttempts      int
				timeout          time.Duration
			}
			var (
				mu   sync.Mutex
				runs = map[string]want{}
				seen = map[string]worker.Task{}
				left = map[string]time.Duration{}
			)
			handle := func(_ context.Context, tk worker.Task) (worker.Result, error) {
				mu.Lock()
				defer mu.Unlock()
				seen[tk.RunID] = tk
				left[tk.RunID] = time.Until(tk.Deadline)
				return worker.Complete(json.RawMessage(`{}`)), nil
			}
			for i := range 6 {
				o := startOpts{Tenant: []string{"acme", "beta"}[i%2], Name: []string{"wf-a", "wf-b"}[i%3%2],
					Key: fmt.Sprintf("k%d", i%3), MaxAttempts: 1 + i}
				if i%2 == 1 {
					o.Timeout = time.Duration(10+i) * time.Second
				}
				st := b.start(o)
				timeout := o.Timeout
				if timeout == 0 {
					timeout = worker.DefaultTimeout
				}
				runs[st.Run.ID] = want{o.Tenant, o.Name, o.MaxAttempts, timeout}
			}
			cancelled := b.start(startOpts{Name: "wf-a", Key: "k0"})
			_, err := b.db.Exec(b.ctx, `SELECT harvest_run_finish(pk, 'cancelled', NULL, 'cancelled by test') FROM runs WHERE id = $1`,
				cancelled.Run.ID)
			require.NoError(t, err)
			// The worker starts once the run is cancelled: a worker already
			// running could claim the run's task between its start and the
			// cancel (a claim that took rows claims again at once).
			r := b.worker(workerOpts{DB: db, Config: mode.cfg,
				Handlers: map[string]worker.HandlerFunc{"wf-a": handle, "wf-b": handle}})
			b.wake("q")

			outcomes := map[string]worker.Outcome{}
			for range len(runs) + 1 {
				f := r.next(t, b.ctx)
				require.NoError(t, f.Err)
				outcomes[f.Task.RunID] = f.Outcome
			}
			require.Equal(t, worker.OutcomeDiscarded, outcomes[cancelled.Run.ID], "the cancelled run's task is retired")
			mu.Lock()
			defer mu.Unlock()
			require.NotContains(t, seen, cancelled.Run.ID, "the cancelled run's handler never ran")
			require.Len(t, seen, len(runs))
			for id, w := range runs {
				require.Equal(t, worker.OutcomeCompleted, outcomes[id])
				tk := seen[id]
				require.Equal(t, w.tenant, tk.Tenant, id)
				require.Equal(t, w.workflow, tk.Workflow, id)
				require.Equal(t, w.maxAttempts, tk.MaxAttempts, id)
				require.LessOrEqual(t, left[id], w.timeout, id)
				require.Greater(t, left[id], w.timeout-time.Minute, "%s: the deadline is the run's timeout", id)
			}
			require.Equal(t, api.StatusCancelled, b.run("acme", cancelled.Run.ID).Status)

			r.Stop(t)
			claims := 0
			for _, sql := range log.all() {
				require.NotRegexp(t, readsRuns, sql, "a statement of the worker reads the runs")
				if regexp.MustCompile(`harvest_claim(_batch)?\(`).MatchString(sql) {
					claims++
				}
			}
			require.Positive(t, claims, "the log saw the claims")
		})
	}
}

// A claim the database lost after the worker got it (a failover to an
// asynchronous standby that had not received it; docs/claim.md, "Why a
// claim waits for its flush"): the task row is pending again as before the
// claim, while the worker runs it. The worker learns at its next heartbeat
// that the lease is gone, cancels the handler (ErrLeaseLost) and drops its
// result, and the task runs again, as the same attempt: the lost execution
// is not counted. Here the loss is made by hand: the task and its run are
// put back as they were before the claim.
func TestClaimLostInACrashRunsAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := newBlocker()
	h.result.Store(&worker.Result{Output: json.RawMessage(`"lost"`)})
	var (
		mu       sync.Mutex
		attempts []worker.Task
		first    = true
	)
	r := b.worker(workerOpts{
		Config: func(c *worker.Config) {
			c.FairnessKeys = true
			c.HeartbeatInterval = 10 * time.Millisecond
		},
		Handlers: map[string]worker.HandlerFunc{"job": func(ctx context.Context, tk worker.Task) (worker.Result, error) {
			mu.Lock()
			attempts = append(attempts, tk)
			again := !first
			first = false
			mu.Unlock()
			if again {
				return worker.Complete(json.RawMessage(`"again"`)), nil
			}
			return h.handle(ctx, tk)
		}},
	})
	st := b.start(startOpts{Name: "job", Key: "k"})
	b.wake("q")
	<-h.started
	_, err := b.db.Exec(b.ctx, `
		WITH t AS (
			UPDATE tasks SET state = 'pending', attempt = attempt - 1, lease_token = NULL,
			       lease_expires_at = NULL, claimed_by = NULL, claimed_at = NULL
			WHERE id = $1 RETURNING run_pk)
		UPDATE runs SET status = 'queued', attempts = attempts - 1, claimed_at = NULL
		WHERE pk = (SELECT run_pk FROM t)`, st.TaskID)
	require.NoError(t, err)

	require.ErrorIs(t, <-h.cause, worker.ErrLeaseLost)
	lost := r.next(t, b.ctx)
	require.Equal(t, worker.OutcomeDiscarded, lost.Outcome, "the lost claim's result is refused")
	again := r.next(t, b.ctx)
	require.Equal(t, worker.OutcomeCompleted, again.Outcome)
	require.Equal(t, st.TaskID, again.Task.ID, "the same task runs again")
	mu.Lock()
	require.Len(t, attempts, 2)
	require.Equal(t, attempts[0].Attempt, attempts[1].Attempt, "the lost attempt was never counted")
	mu.Unlock()
	run := b.run("acme", st.Run.ID)
	require.Equal(t, api.StatusCompleted, run.Status)
	require.JSONEq(t, `"again"`, string(run.Output))
}
