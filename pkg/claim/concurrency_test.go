package claim_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/claim"
)

// A key with no debt that arrives while C claim loops drain a flood is
// claimed within one claim per other active key plus C - 1, counted in the
// claim order the database records (claimed_at). Up to C further claims are
// allowed for statements whose snapshot was taken before the new row
// committed: they could not see it.
func TestNewKeyWaitsAtMostOneClaimPerActiveKey(t *testing.T) {
	t.Parallel()
	const C = 4
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(testsvc.NewDBURL(t))
	require.NoError(t, err)
	cfg.MaxConns = C + 2
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer db.Close()
	b := &bundle{ctx: ctx, db: db, t: t}

	run := b.run(runOpts{})
	others := []string{"flood", "k1", "k2", "k3", "k4", "k5"}
	for i, k := range others {
		n := 40
		if i == 0 {
			n = 600
		}
		for range n {
			b.task(taskOpts{RunPK: run, Key: k, DueAt: t0})
		}
	}

	var claims atomic.Int64
	var newID atomic.Int64
	var claimed sync.Map // the ids of the tasks claimed so far
	// The loops stop once the new key's row has been claimed. They judge
	// it by every id claimed, not by the id of their own last claim: a
	// loop may claim the row before the test has stored its id.
	newClaimed := func() bool {
		id := newID.Load()
		if id == 0 {
			return false
		}
		_, ok := claimed.Load(id)
		return ok
	}
	var wg sync.WaitGroup
	errs := make(chan error, C)
	for w := range C {
		wg.Go(func() {
			req := claim.Request{Queue: "q", Worker: string(rune('a' + w)), Fair: true}
			for !newClaimed() {
				r, err := claim.Claim(ctx, db, req)
				if err != nil {
					errs <- err
					return
				}
				if !r.OK {
					continue
				}
				claims.Add(1)
				claimed.Store(r.Task.ID, struct{}{})
				if err := claim.Complete(ctx, db, r.Task.ID, r.Task.LeaseToken, nil); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for claims.Load() < 60 {
		time.Sleep(time.Millisecond)
	}
	id := b.task(taskOpts{RunPK: run, Key: "newcomer"})
	var after time.Time
	require.NoError(t, db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&after))
	newID.Store(id)
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}

	var before int
	require.NoError(t, db.QueryRow(ctx, `
		SELECT count(*) FROM tasks
		WHERE claimed_at > $1 AND claimed_at < (SELECT claimed_at FROM tasks WHERE id = $2)`,
		after, id).Scan(&before))
	bound := len(others) + C - 1 + C
	t.Logf("claims before the new key: %d (bound %d, %d claims in all)", before, bound, claims.Load())
	require.LessOrEqual(t, before, bound)
}

// One key with a flood is still served by every claimer: a claim never
// comes back empty while the key has work. Rows only leave the pending
// state, and each loop holds at most one claimed task it has not counted
// yet; so when fewer than 400 - C are counted once an empty claim has
// returned, some row was pending all through that claim, which should
// have taken it. (Counting before the claim instead would race the other
// loops, which may take the last rows while this one waits for the CPU.)
func TestOneKeyFloodServedByAllClaimers(t *testing.T) {
	t.Parallel()
	const C, n = 4, 400
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(testsvc.NewDBURL(t))
	require.NoError(t, err)
	cfg.MaxConns = C + 1
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer db.Close()
	b := &bundle{ctx: ctx, db: db, t: t}
	run := b.run(runOpts{})
	b.exec(`INSERT INTO tasks (run_pk, queue, fairness_key) SELECT $1, 'q', 'only' FROM generate_series(1, $2)`, run, n)

	var empty, taken atomic.Int64
	var wg sync.WaitGroup
	for range C {
		wg.Go(func() {
			for taken.Load() < n {
				r, err := claim.Claim(ctx, db, claim.Request{Queue: "q", Fair: true})
				if err != nil {
					t.Error(err)
					return
				}
				if r.OK {
					taken.Add(1)
				} else if taken.Load() < n-C {
					empty.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, n, taken.Load())
	require.Zero(t, empty.Load(), "claims came back empty while the key had pending rows")
	var head *int64
	require.NoError(t, db.QueryRow(ctx, `SELECT head_id FROM fair_state WHERE key = 'only'`).Scan(&head))
	require.Nil(t, head, "the drained key keeps no head")
}

// A concurrency cap holds when several claimers race for it: the quota
// row's lock makes the count and the lease one step. It runs at 1, 4 and
// 16 claimers, by single claims and by batches (whose fair bulk steps
// apply the rechecks themselves), with half the rows committed while the
// claimers run.
func TestConcurrencyCapHoldsUnderConcurrentClaims(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ claimers, batch int }{{1, 1}, {4, 1}, {4, 5}, {16, 1}, {16, 5}} {
		t.Run(fmt.Sprintf("claimers=%d/batch=%d", tc.claimers, tc.batch), func(t *testing.T) {
			t.Parallel()
			capHolds(t, tc.claimers, tc.batch)
		})
	}
}

func capHolds(t *testing.T, claimers, batch int) {
	const limit, n = 2, 120
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(testsvc.NewDBURL(t))
	require.NoError(t, err)
	cfg.MaxConns = int32(claimers + 2)
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer db.Close()
	b := &bundle{ctx: ctx, db: db, t: t}
	run := b.run(runOpts{})
	b.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent) VALUES ('q', 'capped', $1)`, limit)
	// Half the rows before the claimers start, the rest committed in small
	// groups while they run; rows of other keys without a quota besides.
	insert := func(from, to int) {
		b.exec(`INSERT INTO tasks (run_pk, queue, fairness_key, quota_key)
			SELECT $1, 'q', 'k' || (g % 7), CASE WHEN g % 3 = 0 THEN '' ELSE 'capped' END
			FROM generate_series($2::int, $3::int) g`, run, from, to)
	}
	insert(1, n/2)

	var inflight, peak, done atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for g := n/2 + 1; g <= n; g += 6 {
			insert(g, min(g+5, n))
			time.Sleep(time.Millisecond)
		}
	})
	for w := range claimers {
		wg.Go(func() {
			req := claim.Request{Queue: "q", Worker: fmt.Sprintf("w%d", w), Fair: w%2 == 0}
			for done.Load() < n {
				var rs []claim.Result
				if batch == 1 {
					r, err := claim.Claim(ctx, db, req)
					if err != nil {
						t.Error(err)
						return
					}
					rs = []claim.Result{r}
				} else {
					var err error
					if rs, err = claim.ClaimBatch(ctx, db, req, batch); err != nil {
						t.Error(err)
						return
					}
				}
				var held []claim.Task
				for _, r := range rs {
					if r.OK && r.Task.QuotaKey == "capped" {
						held = append(held, r.Task)
					} else if r.OK {
						if err := claim.Complete(ctx, db, r.Task.ID, r.Task.LeaseToken, nil); err != nil {
							t.Error(err)
							return
						}
						done.Add(1)
					}
				}
				// Counted from after the claim's commit to before the
				// completion's: never more than the database holds.
				cur := inflight.Add(int64(len(held)))
				for {
					p := peak.Load()
					if cur <= p || peak.CompareAndSwap(p, cur) {
						break
					}
				}
				time.Sleep(time.Millisecond)
				inflight.Add(-int64(len(held)))
				for _, h := range held {
					if err := claim.Complete(ctx, db, h.ID, h.LeaseToken, nil); err != nil {
						t.Error(err)
						return
					}
					done.Add(1)
				}
			}
		})
	}
	wg.Wait()
	require.EqualValues(t, n, done.Load())
	require.LessOrEqual(t, peak.Load(), int64(limit))
	var left int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM tasks WHERE state <> 'done'`).Scan(&left))
	require.Zero(t, left, "every row claimed and completed")
}

// Light keys that come back as soon as they are served (each one in debt by
// at most one claim) are each served within one round of the other active
// keys plus the claim loops, while a flood of one key is drained by C
// loops. This is the case where a claim that started before a row
// committed must still be able to take it once it sees it.
func TestReturningKeysServedEveryRound(t *testing.T) {
	t.Parallel()
	const C, lightKeys, perKey = 4, 5, 15
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(testsvc.NewDBURL(t))
	require.NoError(t, err)
	cfg.MaxConns = C + 2
	db, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer db.Close()
	b := &bundle{ctx: ctx, db: db, t: t}
	run := b.run(runOpts{})
	b.exec(`SELECT count(harvest_enqueue($1, 'q', 'flood', '', 0, false, NULL, NULL, NULL, 0, NULL, NULL, NULL))
		FROM generate_series(1, 3000)`, run)

	served := make(chan string, lightKeys*perKey)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range C {
		wg.Go(func() {
			req := claim.Request{Queue: "q", Worker: string(rune('a' + w)), Fair: true}
			for {
				select {
				case <-stop:
					return
				default:
				}
				r, err := claim.Claim(ctx, db, req)
				if err != nil {
					t.Error(err)
					return
				}
				if !r.OK {
					continue
				}
				if r.Task.Key != "flood" {
					served <- r.Task.Key
				}
				if err := claim.Complete(ctx, db, r.Task.ID, r.Task.LeaseToken, nil); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	added := map[string]int{}
	var ids []int64
	var addedAt []time.Time
	add := func(key string) {
		added[key]++
		var id int64
		var at time.Time
		require.NoError(t, db.QueryRow(ctx, `SELECT harvest_enqueue($1, 'q', $2, '', 0, false, NULL, NULL, NULL, 0, NULL, NULL, NULL)`,
			run, key).Scan(&id))
		// The row counts as added once it has committed: a time read in the
		// inserting statement would leave the claims made while this
		// goroutine waited to commit (any number, on a loaded machine) in
		// the window, though none of them could see the row.
		require.NoError(t, db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&at))
		ids = append(ids, id)
		addedAt = append(addedAt, at)
	}
	for k := range lightKeys {
		add(fmt.Sprintf("light-%d", k))
	}
	for range lightKeys * perKey {
		k := <-served
		if added[k] < perKey {
			add(k)
		}
	}
	close(stop)
	wg.Wait()

	bound := 1 + lightKeys + C
	rows, err := db.Query(ctx, `
		SELECT (SELECT count(*) FROM tasks x WHERE x.claimed_at > a.added_at AND x.claimed_at <= l.claimed_at)
		FROM unnest($1::bigint[], $2::timestamptz[]) a(id, added_at) JOIN tasks l ON l.id = a.id
		ORDER BY a.id`, ids, addedAt)
	require.NoError(t, err)
	positions, err := pgx.CollectRows(rows, pgx.RowTo[int])
	require.NoError(t, err)
	require.Len(t, positions, lightKeys*perKey)
	for i, p := range positions {
		require.LessOrEqual(t, p, bound, "task %d was claim number %d after it was added", ids[i], p)
	}
}
