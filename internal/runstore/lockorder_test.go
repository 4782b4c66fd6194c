package runstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testfactory"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// byteOrderPairs are tenant names (first, second) whose byte order
// (first < second) is the reverse of their order under the ICU en-US
// collation: punctuation and case sort differently there.
var byteOrderPairs = [][2]string{{"a-c", "a_b"}, {"B", "a"}, {"Zeta", "alpha-1"}}

// collatedBundle is a shard whose default collation is ICU en-US, so that
// a statement sorting tenants by the database's collation takes them in
// another order than one sorting by bytes.
func collatedBundle(t *testing.T) bundle {
	t.Helper()
	db, err := pgxpool.New(context.Background(), testsvc.NewDBCollatedURL(t, "en-US"))
	require.NoError(t, err)
	t.Cleanup(db.Close)
	b := bundle{ctx: context.Background(), db: db}
	var before bool
	require.NoError(t, db.QueryRow(b.ctx, `SELECT $1::text < $2::text`, "a_b", "a-c").Scan(&before))
	require.True(t, before, "the database's collation must sort a_b before a-c")
	return b
}

// leaseTask makes a running task of a new run of tenant with the given
// attempt, max attempts and lease expiry, and returns its id and token.
func leaseTask(t *testing.T, b bundle, tenant string, attempt, maxAttempts int, expires time.Duration) (int64, uuid.UUID) {
	t.Helper()
	pk := testfactory.Run(b.ctx, t, b.db, testfactory.RunOpts{Tenant: tenant, MaxAttempts: maxAttempts})
	_, id := testfactory.Task(b.ctx, t, b.db, testfactory.TaskOpts{RunPK: pk})
	token := uuid.New()
	_, err := b.db.Exec(b.ctx, `UPDATE tasks SET state = 'running', attempt = $2, lease_token = $3,
		lease_expires_at = now() + $4 * interval '1 millisecond' WHERE id = $1`, id, attempt, token, expires.Milliseconds())
	require.NoError(t, err)
	_, err = b.db.Exec(b.ctx, `UPDATE runs SET status = 'running', attempts = $2 WHERE pk = $1`, pk, attempt)
	require.NoError(t, err)
	return id, token
}

// requireByteOrder runs op while another transaction holds first's count
// row (first sorts before second in bytes). Once op waits for that row it
// must not hold second's yet: it takes tenant rows in byte order. A
// statement that sorted them by the database's collation would have taken
// second's row first, and a NOWAIT lock of it fails.
func requireByteOrder(t *testing.T, b bundle, first, second string, op func(ctx context.Context, conn *pgx.Conn) error) {
	t.Helper()
	ctx := b.ctx
	_, err := b.db.Exec(ctx, `INSERT INTO tenant_running (tenant, running) VALUES ($1, 0), ($2, 0)
		ON CONFLICT (tenant) DO NOTHING`, first, second)
	require.NoError(t, err)

	blocker, err := b.db.Begin(ctx)
	require.NoError(t, err)
	defer blocker.Rollback(ctx) //nolint:errcheck // released below; a no-op then
	_, err = blocker.Exec(ctx, `SELECT 1 FROM tenant_running WHERE tenant = $1 FOR UPDATE`, first)
	require.NoError(t, err)

	conn, err := b.db.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	var pid int32
	require.NoError(t, conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	done := make(chan error, 1)
	go func() { done <- op(ctx, conn.Conn()) }()

	// Wait until op's backend waits for a lock (the blocker's row).
	require.Eventually(t, func() bool {
		select {
		case err := <-done:
			done <- err
			return true
		default:
		}
		var waiting bool
		err := b.db.QueryRow(ctx, `SELECT coalesce(wait_event_type = 'Lock', false) FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&waiting)
		return err == nil && waiting
	}, time.Minute, 5*time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the operation finished (%v) while %s's row was held: it never took that row", err, first)
	default:
	}

	probe, err := b.db.Begin(ctx)
	require.NoError(t, err)
	_, perr := probe.Exec(ctx, `SELECT 1 FROM tenant_running WHERE tenant = $1 FOR UPDATE NOWAIT`, second)
	require.NoError(t, probe.Rollback(ctx))
	require.NoError(t, blocker.Rollback(ctx))
	require.NoError(t, <-done)
	var pgErr *pgconn.PgError
	if errors.As(perr, &pgErr) && pgErr.Code == "55P03" {
		t.Fatalf("the operation locked %s's row before %s's: tenant rows must be taken in byte order", second, first)
	}
	require.NoError(t, perr)
}

// Every statement that holds the count rows of several tenants takes them
// in byte order, whatever the database's collation: a start group's lock,
// a completion batch, the rescue of expired leases and the recount. Two
// orders would let a start group and a completion batch deadlock with
// mixed-case or punctuated tenant names.
func TestTenantRowsAreLockedInByteOrder(t *testing.T) {
	t.Parallel()
	b := collatedBundle(t)
	for _, pair := range byteOrderPairs {
		first, second := pair[0], pair[1]
		t.Run(fmt.Sprintf("%s<%s", first, second), func(t *testing.T) {
			t.Run("start group", func(t *testing.T) {
				requireByteOrder(t, b, first, second, func(ctx context.Context, conn *pgx.Conn) error {
					tx, err := conn.Begin(ctx)
					if err != nil {
						return err
					}
					defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit
					if _, err := tx.Exec(ctx, sqlTenantRunningLock, []string{second, first}); err != nil {
						return err
					}
					return tx.Commit(ctx)
				})
			})
			t.Run("start statement", func(t *testing.T) {
				// The statement of a start group locks the rows itself,
				// whatever order its starts come in.
				var items []*pending
				for i, tenant := range []string{second, first} {
					it := &pending{p: StartParams{Tenant: tenant, Shard: 1, Req: api.StartRequest{
						ID: fmt.Sprint("stmt-", i), Name: "echo", Queue: "lock-stmt", Input: json.RawMessage(`{}`)}}}
					var err error
					it.row, err = startRowOf(&it.p)
					require.NoError(t, err)
					items = append(items, it)
				}
				g := newGroup(items)
				g.sent[0], g.sent[1] = g.sent[1], g.sent[0]
				requireByteOrder(t, b, first, second, func(ctx context.Context, conn *pgx.Conn) error {
					tx, err := conn.Begin(ctx)
					if err != nil {
						return err
					}
					defer tx.Rollback(ctx) //nolint:errcheck // a no-op after commit
					if _, err := tx.Exec(ctx, sqlRunStartGroup, groupArgs(g, nil, false)...); err != nil {
						return err
					}
					return tx.Commit(ctx)
				})
			})
			t.Run("completion batch", func(t *testing.T) {
				id1, tok1 := leaseTask(t, b, second, 1, 3, time.Hour)
				id2, tok2 := leaseTask(t, b, first, 1, 3, time.Hour)
				requireByteOrder(t, b, first, second, func(ctx context.Context, conn *pgx.Conn) error {
					errs, err := claim.CompleteBatch(ctx, conn, []claim.Completion{
						{ID: id1, Token: tok1, Output: json.RawMessage(`1`)},
						{ID: id2, Token: tok2, Output: json.RawMessage(`2`)},
					})
					if err != nil {
						return err
					}
					return errors.Join(errs...)
				})
			})
			t.Run("outcome batch", func(t *testing.T) {
				// Every kind at once: the runs of both tenants finish (a
				// completion of second's, a final failure of first's),
				// beside a retry, a continuation and a release.
				done2, tok2 := leaseTask(t, b, second, 1, 3, time.Hour)
				fail1, tokF := leaseTask(t, b, first, 1, 1, time.Hour)
				retry1, tokR := leaseTask(t, b, first, 1, 3, time.Hour)
				cont2, tokC := leaseTask(t, b, second, 1, 3, time.Hour)
				back1, tokB := leaseTask(t, b, first, 1, 3, time.Hour)
				requireByteOrder(t, b, first, second, func(ctx context.Context, conn *pgx.Conn) error {
					res, err := claim.RecordOutcomes(ctx, conn, time.Time{}, []claim.Outcome{
						{Kind: claim.OutcomeComplete, ID: done2, Token: tok2, Output: json.RawMessage(`1`)},
						{Kind: claim.OutcomeContinue, ID: cont2, Token: tokC},
						{Kind: claim.OutcomeFail, ID: retry1, Token: tokR, Fail: claim.FailOptions{Error: "again", RetryAfter: time.Second}},
						{Kind: claim.OutcomeRelease, ID: back1, Token: tokB},
						{Kind: claim.OutcomeFail, ID: fail1, Token: tokF, Fail: claim.FailOptions{Error: "last", RetryAfter: time.Second}},
					})
					if err != nil {
						return err
					}
					var errs []error
					for _, r := range res {
						errs = append(errs, r.Err)
					}
					if res[0].Run == nil || res[4].Run == nil {
						errs = append(errs, errors.New("the two finished runs were not returned"))
					}
					return errors.Join(errs...)
				})
			})
			t.Run("rescue", func(t *testing.T) {
				// Both leases expired on their last attempt: the rescue
				// fails both runs and releases both tenants' slots.
				leaseTask(t, b, second, 3, 3, -time.Hour)
				leaseTask(t, b, first, 3, 3, -time.Hour)
				requireByteOrder(t, b, first, second, func(ctx context.Context, conn *pgx.Conn) error {
					got, err := claim.RescueExpired(ctx, conn, 100)
					if err == nil && got.Failed != 2 {
						err = fmt.Errorf("rescue failed %d runs, want 2", got.Failed)
					}
					return err
				})
			})
			t.Run("recount", func(t *testing.T) {
				// The recount locks only counts that drifted.
				_, err := b.db.Exec(b.ctx, `INSERT INTO tenant_running (tenant, running) VALUES ($1, 7), ($2, 7)
					ON CONFLICT (tenant) DO UPDATE SET running = tenant_running.running + 7`, first, second)
				require.NoError(t, err)
				requireByteOrder(t, b, first, second, func(ctx context.Context, conn *pgx.Conn) error {
					_, err := tenantcap.Recount(ctx, conn)
					return err
				})
			})
		})
	}
}

// Start groups, completion batches, retries, rescues and recounts of
// tenants whose byte order and collation order differ run against each
// other: none deadlocks, and every count equals a recount afterwards.
func TestTenantLockOrderUnderConcurrency(t *testing.T) {
	t.Parallel()
	b := collatedBundle(t)
	tenants := []string{"a-c", "a_b", "B", "a", "Zeta", "alpha-1"}
	c := NewCommitter(b.db, 1, CommitterOptions{Flushers: 2, MaxBatch: 16, Admitter: &recorder{}})
	defer c.Close()

	const rounds = 12
	var wg sync.WaitGroup
	errc := make(chan error, 64)
	report := func(what string, err error) {
		if err != nil {
			errc <- fmt.Errorf("%s: %w", what, err)
		}
	}
	// Starts: each round a group of every tenant, in reverse order.
	wg.Go(func() {
		for r := range rounds {
			var ps []StartParams
			for i := len(tenants) - 1; i >= 0; i-- {
				ps = append(ps, StartParams{Tenant: tenants[i], Shard: 1, Req: api.StartRequest{
					ID: fmt.Sprintf("s%d", r), Name: "echo", Queue: "lock-q", Input: json.RawMessage(`{}`)}})
			}
			for _, res := range c.StartMany(b.ctx, ps) {
				report("start", res.Err)
			}
		}
	})
	// Claims and completion batches of whatever is pending.
	wg.Go(func() {
		for range rounds * 2 {
			got, err := claim.ClaimBatch(b.ctx, b.db, claim.Request{Queue: "lock-q"}, 8)
			if err != nil {
				report("claim", err)
				return
			}
			var cs []claim.Completion
			for _, g := range got {
				if !g.OK {
					continue
				}
				cs = append(cs, claim.Completion{ID: g.Task.ID, Token: g.Task.LeaseToken, Output: json.RawMessage(`{}`)})
			}
			if len(cs) > 0 {
				errs, err := claim.CompleteBatch(b.ctx, b.db, cs)
				report("complete", errors.Join(append(errs, err)...))
			}
		}
	})
	// Expired leases on their last attempt, rescued, and recounts.
	wg.Go(func() {
		for r := range rounds {
			for i, tenant := range tenants {
				if (r+i)%2 == 0 {
					leaseTask(t, b, tenant, 1, 1, -time.Second)
				}
			}
			_, err := claim.RescueExpired(b.ctx, b.db, 100)
			report("rescue", err)
			_, err = tenantcap.Recount(b.ctx, b.db)
			report("recount", err)
		}
	})
	// Retries of failed runs, one tenant at a time.
	wg.Go(func() {
		for r := range rounds {
			tenant := tenants[r%len(tenants)]
			pk := testfactory.Run(b.ctx, t, b.db, testfactory.RunOpts{Tenant: tenant, ID: fmt.Sprintf("f%d", r), Uncounted: true})
			// Its own queue: the claim loop above must not take the task
			// this goroutine marks done.
			testfactory.Task(b.ctx, t, b.db, testfactory.TaskOpts{RunPK: pk, Queue: "retry-q"})
			_, err := b.db.Exec(b.ctx, `UPDATE tasks SET state = 'done' WHERE run_pk = $1`, pk)
			report("fail run", err)
			_, err = b.db.Exec(b.ctx, `UPDATE runs SET status = 'failed', finished_at = now() WHERE pk = $1`, pk)
			report("fail run", err)
			_, err = Retry(b.ctx, b.db, RetryParams{Tenant: tenant, ID: fmt.Sprintf("f%d", r), Shard: 1, Actor: "tester", Admitter: &recorder{}})
			report("retry", err)
		}
	})
	wg.Wait()
	close(errc)
	for err := range errc {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
			t.Errorf("deadlock: %v", err)
			continue
		}
		t.Error(err)
	}
	drift, err := tenantcap.Drift(b.ctx, b.db)
	require.NoError(t, err)
	require.Empty(t, drift, "every tenant's count equals its unfinished runs")
}

// Workers recording every kind of outcome in batches (completions,
// continuations, retries, final failures, releases) of tenants whose byte
// order and collation order differ, while start groups, rescues and
// recounts commit: no statement deadlocks (each batch runs in a
// transaction of its own, so a deadlock would surface instead of being
// retried), and every count equals a recount afterwards. With 1, 4 and 16
// workers.
func TestOutcomeBatchesUnderConcurrency(t *testing.T) {
	t.Parallel()
	for _, workers := range []int{1, 4, 16} {
		t.Run(fmt.Sprintf("%d workers", workers), func(t *testing.T) {
			t.Parallel()
			// The first error stops every loop, so that a worker left
			// waiting for tasks another one stranded cannot hang the test.
			ctx, stop := context.WithTimeout(context.Background(), 4*time.Minute)
			defer stop()
			cfg, err := pgxpool.ParseConfig(testsvc.NewDBCollatedURL(t, "en-US"))
			require.NoError(t, err)
			cfg.MaxConns = int32(workers + 4)
			db, err := pgxpool.NewWithConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(db.Close)
			b := bundle{ctx: ctx, db: db}
			tenants := []string{"a-c", "a_b", "B", "a", "Zeta", "alpha-1"}
			c := NewCommitter(db, 1, CommitterOptions{Flushers: 2, MaxBatch: 16, Admitter: &recorder{}})
			defer c.Close()

			const rounds = 10
			errc := make(chan error, 1024)
			report := func(what string, err error) {
				if err != nil {
					errc <- fmt.Errorf("%s: %w", what, err)
					stop()
				}
			}
			var starting sync.WaitGroup
			var wg sync.WaitGroup
			starting.Add(1)
			wg.Go(func() {
				defer starting.Done()
				for r := range rounds {
					var ps []StartParams
					for i := len(tenants) - 1; i >= 0; i-- {
						ps = append(ps, StartParams{Tenant: tenants[i], Shard: 1, Req: api.StartRequest{
							ID: fmt.Sprintf("s%d", r), Name: "mix", Queue: "mix-q", Input: json.RawMessage(`{}`)}})
					}
					for _, res := range c.StartMany(ctx, ps) {
						report("start", res.Err)
					}
				}
			})
			started := make(chan struct{})
			go func() { starting.Wait(); close(started) }()
			for w := range workers {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(w), 35))
					for ctx.Err() == nil {
						got, err := claim.ClaimBatch(ctx, db, claim.Request{Queue: "mix-q", Worker: fmt.Sprintf("w%d", w)}, 8)
						if err != nil {
							report("claim", err)
							return
						}
						var outs []claim.Outcome
						for _, g := range got {
							if !g.OK {
								continue
							}
							o := claim.Outcome{ID: g.Task.ID, Token: g.Task.LeaseToken}
							switch k := rng.IntN(10); {
							case k < 3:
								o.Kind, o.Output = claim.OutcomeComplete, json.RawMessage(`{}`)
							case k < 5 && g.Task.Step < 2:
								o.Kind = claim.OutcomeContinue
								o.Continue = claim.ContinueOptions{StickyFor: time.Second}
							case k < 7:
								o.Kind, o.Fail = claim.OutcomeFail, claim.FailOptions{Error: "again", RetryAt: time.Now().Add(-time.Second)}
							case k < 8:
								o.Kind, o.Fail = claim.OutcomeFail, claim.FailOptions{Error: "bad input"}
							case k < 9:
								o.Kind = claim.OutcomeRelease
							default:
								o.Kind = claim.OutcomeComplete
							}
							outs = append(outs, o)
						}
						if len(outs) == 0 {
							select {
							case <-started:
								var left int
								if err := db.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE queue = 'mix-q' AND state <> 'done'`).Scan(&left); err != nil {
									report("count", err)
									return
								}
								if left == 0 {
									return
								}
							default:
							}
							time.Sleep(time.Millisecond)
							continue
						}
						tx, err := db.Begin(ctx)
						if err != nil {
							report("begin", err)
							return
						}
						res, err := claim.RecordOutcomes(ctx, tx, time.Time{}, outs)
						if err == nil {
							err = tx.Commit(ctx)
						}
						_ = tx.Rollback(ctx)
						if err != nil {
							report("record", err)
							return
						}
						for _, r := range res {
							report("record", r.Err)
						}
					}
				})
			}
			// Expired leases on their last attempt, rescued, and recounts.
			wg.Go(func() {
				for r := range rounds {
					for i, tenant := range tenants {
						if (r+i)%2 == 0 {
							leaseTask(t, b, tenant, 1, 1, -time.Second)
						}
					}
					_, err := claim.RescueExpired(ctx, db, 100)
					report("rescue", err)
					_, err = tenantcap.Recount(ctx, db)
					report("recount", err)
				}
			})
			wg.Wait()
			close(errc)
			for err := range errc {
				if errors.Is(err, claim.ErrDeadlock) {
					t.Errorf("deadlock: %v", err)
					continue
				}
				t.Error(err)
			}
			require.NoError(t, ctx.Err(), "the mix did not drain in time")
			drift, err := tenantcap.Drift(ctx, db)
			require.NoError(t, err)
			require.Empty(t, drift, "every tenant's count equals its unfinished runs")
			var unfinished int
			require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM runs WHERE finished_at IS NULL AND queue = 'mix-q'`).Scan(&unfinished))
			require.Zero(t, unfinished, "every run of the mix ended")
		})
	}
}
