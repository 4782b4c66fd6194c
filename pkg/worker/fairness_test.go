package worker_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/harvest-run/harvest/pkg/worker"
)

// The flood: 10,000 tasks of one key, inserted in one statement through
// the enqueue function (so the per-key summary the fair claim reads is
// maintained as for any start).
const floodSQL = `
WITH r AS (
    INSERT INTO runs (tenant, id, name, queue, fairness_key, request_hash)
    SELECT 'flood', 'flood-' || g, 'noop', 'q', 'flood', '\x00'::bytea FROM generate_series(1, $1) g
    RETURNING pk
)
SELECT count(harvest_enqueue(pk, 'q', 'flood', '', 0, false, NULL, NULL, NULL, 0, NULL, NULL, NULL)) FROM r`

// One light task, in one statement; it returns the task's id and the
// database clock at the end of the statement (the test reads the clock
// again after the commit, when the task became visible to claims).
const lightSQL = `
WITH r AS (
    INSERT INTO runs (tenant, id, name, queue, fairness_key, request_hash)
    VALUES ('light', $1, 'noop', 'q', $2, '\x00'::bytea)
    RETURNING pk
)
SELECT harvest_enqueue(pk, 'q', $2, '', 0, false, NULL, NULL, NULL, 0, NULL, NULL, NULL), clock_timestamp() FROM r`

func TestFloodCannotHoldLightKeys(t *testing.T) {
	t.Parallel()
	const (
		flood     = 10000
		lightKeys = 5
		perKey    = 20
		loops     = 4
	)
	b := setup(t)
	var n int
	require.NoError(t, b.db.QueryRow(b.ctx, floodSQL, flood).Scan(&n))
	require.Equal(t, flood, n)

	claimedLight := make(chan string, lightKeys*perKey)
	r := b.worker(workerOpts{
		NoNATS: true,
		Config: func(c *worker.Config) {
			c.FairnessKeys = true
			c.MaxConcurrentClaims = loops
			c.PollInterval = 10 * time.Millisecond
		},
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
		// Count from when the task could be claimed: after its commit, not
		// from inside its transaction (a slow commit would otherwise count
		// the claims made while it was still invisible).
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

	// Every light task was claimed within (active keys + claim loops)
	// claims of being added, counting claims in the database's order.
	bound := 1 + lightKeys + loops
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
		if p > bound {
			t.Logf("task %d (light #%d in insert order) position %d", ids[i], i, p)
		}
	}
	var unclaimed int
	require.NoError(t, b.db.QueryRow(b.ctx, `SELECT count(*) FROM tasks WHERE id = ANY($1) AND claimed_at IS NULL`, ids).Scan(&unclaimed))
	require.Zero(t, unclaimed, "every light task was claimed")
	for i, p := range positions {
		// Zero: claimed before the clock was read after its commit.
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

// Not parallel: goleak compares the goroutines alive before and after.
func TestNoGoroutineLeftAfterStop(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // runs after every other cleanup
	b := setup(t)
	ticks := make(chan struct{}, 1000)
	r := b.worker(workerOpts{
		Config: func(c *worker.Config) {
			c.MaxConcurrentClaims = 3
			c.RunJanitor = true
			c.JanitorInterval = 10 * time.Millisecond
			c.HeartbeatInterval = 5 * time.Millisecond
		},
		Hooks: worker.Hooks{Janitor: func(worker.JanitorReport, error) { ticks <- struct{}{} }},
		Handlers: map[string]worker.HandlerFunc{
			"sleepy": func(ctx context.Context, tk worker.Task) (worker.Result, error) {
				select {
				case <-time.After(30 * time.Millisecond): // lets a few heartbeats run
				case <-ctx.Done():
				}
				return worker.Complete(nil), nil
			},
		},
	})
	b.start(startOpts{Name: "sleepy"})
	b.wake("q")
	require.Equal(t, worker.OutcomeCompleted, r.next(t, b.ctx).Outcome)
	<-ticks
	r.Stop(t)
}
