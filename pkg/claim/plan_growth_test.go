package claim_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/shard"
)

// A claim's statements keep plans made once per connection: the bulk steps
// force generic plans, and the plan cache settles on generic plans for the
// others after a few calls, from the statistics of that moment. A plan
// made on a small, freshly analysed shard must still find its rows by
// index once the shard has grown (and its statistics, with autovacuum off
// or behind, still say it is small): a later claim on the same connection
// reads a few blocks of tasks and runs for each row it takes, not the
// tables. One case per way a worker claims: fair, two-level, sticky,
// ordinary and shallow batches (the last begins with single steps), a
// fair batch whose rows carry quota keys, fair batches over a key or a
// group per row (the fair steps join every key's head to its task), and
// single claims. Before the measured claims new starts arrive (the fair
// claim folds them in) and retries fall due (the claim promotes them).
func TestClaimPlansOutliveTheShardsGrowth(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, quota    string
		rows           int
		key            string
		fair, twoLevel bool
		sticky         bool
		shallow        bool
		single         bool
	}{
		{name: "fair", fair: true},
		{name: "two-level", fair: true, twoLevel: true},
		{name: "sticky", fair: true, sticky: true},
		{name: "ordinary"},
		{name: "shallow", fair: true, shallow: true},
		{name: "quota", fair: true, quota: `'qk-' || r.pk % 2`},
		{name: "many keys", fair: true, rows: 2000, key: `'k-' || r.pk`},
		{name: "many groups", fair: true, twoLevel: true, rows: 2000, key: `'t' || r.pk || '/k'`},
		{name: "single fair", fair: true, single: true},
		{name: "single ordinary", single: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tb := setup(t)
			conn := tb.conn()
			if tc.twoLevel {
				tb.exec(`SELECT harvest_queue_fairness_set('q', true, 'claims', 'test')`)
			}
			quota := `''`
			if tc.quota != "" {
				quota = tc.quota
				tb.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent) VALUES ('q', 'qk-0', 1000), ('q', 'qk-1', 1000)`)
			}
			rows, key := 200, `'t' || r.pk % 3 || '/k-' || r.pk % 10`
			if tc.rows > 0 {
				rows, key = tc.rows, tc.key
			}
			fillBacklog(tb, rows, key, quota, tc.fair)
			if tc.sticky {
				// Continuations pinned to the claiming worker, as its
				// earlier steps leave them.
				tb.exec(`UPDATE tasks SET sticky_worker = 'w', sticky_until = now() + interval '1 hour', continuation = true`)
				tb.exec(`VACUUM ANALYZE tasks`)
			}
			req := claim.Request{Queue: "q", Worker: "w", Fair: tc.fair, Shallow: tc.shallow}
			take := func(db shard.Querier, n int) int {
				t.Helper()
				if !tc.single {
					rs, err := claim.ClaimBatch(tb.ctx, db, req, n)
					require.NoError(t, err)
					return len(rs)
				}
				got := 0
				for range n {
					r, err := claim.Claim(tb.ctx, db, req)
					require.NoError(t, err)
					require.True(t, r.OK, "claim %d: %s", got+1, r.Empty)
					got++
				}
				return got
			}
			// Claims enough for the plan cache to settle on its plans (it
			// weighs a generic plan after five custom ones), with arrivals
			// and due retries among them.
			for i := range 10 {
				if i%3 == 0 {
					arrive(tb, 2)
				}
				require.Equal(t, 2, take(conn, 2))
			}

			// The history, then two starts and two due retries.
			afterGrowth(t, tb, conn, func() { arrive(tb, 2) }, func(tx pgx.Tx) {
				require.Equal(t, 20, take(tx, 20))
			})
		})
	}
}

// arrive adds n new pending tasks (starts: the fair claim folds their
// arrival) and n scheduled tasks already due (retries: the claim promotes
// them) to queue q, each with a run of its own.
func arrive(tb *bundle, n int) {
	tb.exec(`WITH r AS (
			INSERT INTO runs (tenant, id, name, queue, request_hash)
			SELECT 't1', 'arrival-' || gen_random_uuid(), 'wf', 'q', '\x00' FROM generate_series(1, 2 * $1::int)
			RETURNING pk)
		INSERT INTO tasks (run_pk, queue, fairness_key, state, due_at)
		SELECT pk, 'q', 't0/k-0', CASE WHEN row_number() OVER (ORDER BY pk) <= $1 THEN 'pending' ELSE 'scheduled' END,
		       now() - interval '1 second'
		FROM r`, n)
}

// The worker's heartbeat and the janitor's rescue of expired leases keep
// their plans per connection as the claim does: made on a small shard and
// kept as it grew, they must still find the leases and their runs by
// index. Each runs often enough on one connection for the plan cache to
// settle, the shard grows, and the next call on that connection reads a
// few blocks for each lease it handles.
func TestHeartbeatAndRescuePlansOutliveTheShardsGrowth(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		call func(tb *bundle, db shard.Querier, leases []claim.Lease)
	}{
		{"heartbeat", func(tb *bundle, db shard.Querier, leases []claim.Lease) {
			beats, err := claim.Heartbeats(tb.ctx, db, leases, time.Hour)
			require.NoError(tb.t, err)
			for i, b := range beats {
				require.Equal(tb.t, claim.BeatOK, b, "lease %d", i)
			}
		}},
		{"rescue", func(tb *bundle, db shard.Querier, leases []claim.Lease) {
			ids := make([]int64, len(leases))
			for i, l := range leases {
				ids[i] = l.ID
			}
			// The leases run out: written on another connection, as a
			// simple query (a prepared one would keep a plan of its own
			// made on the small shard, and read the table here).
			_, err := tb.db.Exec(tb.ctx, `UPDATE tasks SET lease_expires_at = now() - interval '1 second' WHERE id = ANY ($1)`,
				pgx.QueryExecModeSimpleProtocol, ids)
			require.NoError(tb.t, err)
			r, err := claim.RescueExpired(tb.ctx, db, 1000)
			require.NoError(tb.t, err)
			require.Equal(tb.t, len(leases), r.Requeued+r.Failed)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tb := setup(t)
			conn := tb.conn()
			tb.exec(`VACUUM ANALYZE tasks, runs`)
			for range 8 {
				tc.call(tb, conn, tb.leaseMany(3, time.Minute))
			}

			var leases []claim.Lease
			afterGrowth(t, tb, conn, func() { leases = tb.leaseMany(20, time.Minute) }, func(tx pgx.Tx) {
				tc.call(tb, tx, leases)
			})
		})
	}
}

// afterGrowth gives tb's shard its history (testsvc.AddHistory: 30,000
// finished runs and tasks, without the ANALYZE that would make the plans
// anew), runs then, and requires measure, run on conn in a transaction,
// to read fewer than 400 blocks of tasks and of runs: a few for each of
// the 20 rows the callers handle, far under one scan of either table.
func afterGrowth(t *testing.T, tb *bundle, conn *pgxpool.Conn, then func(), measure func(tx pgx.Tx)) {
	t.Helper()
	runPages, taskPages := testsvc.AddHistory(tb.ctx, t, tb.db, "q", 30000)
	require.Greater(t, taskPages, 500, "the history must outgrow the bound below")
	require.Greater(t, runPages, 400, "the history must outgrow the bound below")
	then()
	tx, err := conn.Begin(tb.ctx)
	require.NoError(t, err)
	defer tx.Rollback(tb.ctx) //nolint:errcheck // read only
	testsvc.RequireFewBlocks(tb.ctx, t, tx, 400, func() { measure(tx) })
}
