package claim_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/harvest-run/harvest/pkg/claim"
)

// BenchmarkClaimBatchMix times fair batches of 50 over the mix a worker
// meets under the soak: a backlog of 20,000 normal rows (one key with half
// of them, 100 light keys), and before each batch two rows of a higher
// priority, two continuations pinned to the claiming worker and two
// continuations pinned to no one, on light keys, inserted with the timer
// stopped. It reports the single steps and the bulk steps each batch took
// (steps/op, bulk/op, from pg_stat_user_functions), which say whether the
// batch stayed on the bulk path.
func BenchmarkClaimBatchMix(b *testing.B) {
	tb := setup(b)
	fillBacklog(tb, 20000, `CASE WHEN r.pk % 2 = 0 THEN 'light-' || (r.pk / 2) % 100 ELSE 'heavy' END`, `''`, true)
	conn, calls := stepCounter(b, tb)
	// The mix of one batch, each row in a run of its own: 1 and 2 of
	// priority 1, 3 and 4 continuations pinned to the worker, 5 and 6
	// continuations pinned to no one.
	mix := func(i int) {
		tb.exec(`WITH r AS (
				INSERT INTO runs (tenant, id, name, queue, request_hash)
				SELECT 't1', 'mix-' || $1::bigint || '-' || g, 'wf', 'q', '\x00' FROM generate_series(1, 6) g
				RETURNING pk, id)
			INSERT INTO tasks (run_pk, queue, fairness_key, priority, continuation, sticky_worker, sticky_until, due_at)
			SELECT r.pk, 'q', 'light-' || ((r.pk * 7) % 100),
			       CASE WHEN right(r.id, 1) IN ('1', '2') THEN 1 ELSE 0 END,
			       right(r.id, 1) IN ('3', '4', '5', '6'),
			       CASE WHEN right(r.id, 1) IN ('3', '4') THEN 'w' END,
			       CASE WHEN right(r.id, 1) IN ('3', '4') THEN now() + interval '1 hour' END,
			       now() - interval '1 second'
			FROM r`, int64(i))
	}
	req := claim.Request{Queue: "q", Worker: "w", Fair: true}
	i := 0
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		i++
		mix(i)
		b.StartTimer()
		rs, err := claim.ClaimBatch(tb.ctx, conn, req, 50)
		if err != nil {
			b.Fatal(err)
		}
		if len(rs) < 50 {
			b.StopTimer()
			tb.exec(`UPDATE tasks SET state = 'pending', priority = 0, continuation = false,
				sticky_worker = NULL, sticky_until = NULL WHERE state = 'running'`)
			b.StartTimer()
		}
	}
	b.StopTimer()
	if i > 0 {
		b.ReportMetric(calls("harvest_claim_step")/float64(i), "steps/op")
		b.ReportMetric((calls("harvest_claim_bulk_fair")+calls("harvest_claim_lone"))/float64(i), "bulk/op")
	}
}

// BenchmarkClaimBatchShallow times fair batches of 50 without and with
// claim.Request.Shallow (sub-benchmarks "unmarked" and "marked") on two
// shapes:
//   - two-waiting: two rows wait, on two of 100 keys that have been
//     charged before (the shape of a quiet queue's claims: many free slots,
//     a start or two since the last claim); the two rows are inserted with
//     the timer stopped;
//   - full: 40,000 rows on 100 keys, every batch full (what a wrong mark
//     costs: three single steps in front of the plan).
//
// steps/op and bulk/op as in BenchmarkClaimBatchMix.
func BenchmarkClaimBatchShallow(b *testing.B) {
	for _, full := range []bool{false, true} {
		for _, shallow := range []bool{false, true} {
			name := map[bool]string{false: "two-waiting", true: "full"}[full] + "/" +
				map[bool]string{false: "unmarked", true: "marked"}[shallow]
			b.Run(name, func(b *testing.B) {
				benchShallow(b, full, shallow)
			})
		}
	}
}

func benchShallow(b *testing.B, full, shallow bool) {
	tb := setup(b)
	conn, calls := stepCounter(b, tb)
	req := claim.Request{Queue: "q", Worker: "w", Fair: true, Shallow: shallow}
	if full {
		fillBacklog(tb, 40000, `'k-' || r.pk % 100`, `''`, true)
	} else {
		// Charge every key: drain a backlog.
		fillBacklog(tb, 2000, `'k-' || r.pk % 100`, `''`, true)
		for {
			rs, err := claim.ClaimBatch(tb.ctx, conn, claim.Request{Queue: "q", Worker: "w", Fair: true}, 50)
			if err != nil {
				b.Fatal(err)
			}
			if len(rs) == 0 {
				break
			}
		}
	}
	steps0, bulk0 := calls("harvest_claim_step"), calls("harvest_claim_bulk_fair")
	i := 0
	for b.Loop() {
		i++
		want := 50
		if !full {
			b.StopTimer()
			want = 2
			tb.exec(`WITH r AS (
					INSERT INTO runs (tenant, id, name, queue, request_hash)
					SELECT 't1', 'two-' || $1::bigint || '-' || g, 'wf', 'q', '\x00' FROM generate_series(1, 2) g
					RETURNING pk)
				INSERT INTO tasks (run_pk, queue, fairness_key) SELECT r.pk, 'q', 'k-' || r.pk % 100 FROM r`, int64(i))
			b.StartTimer()
		}
		rs, err := claim.ClaimBatch(tb.ctx, conn, req, 50)
		if err != nil {
			b.Fatal(err)
		}
		if len(rs) != want {
			b.Fatalf("batch %d took %d rows, want %d", i, len(rs), want)
		}
	}
	b.StopTimer()
	if i > 0 {
		b.ReportMetric((calls("harvest_claim_step")-steps0)/float64(i), "steps/op")
		b.ReportMetric((calls("harvest_claim_bulk_fair")-bulk0)/float64(i), "bulk/op")
	}
}

// BenchmarkClaimBatchQuota times fair batches of 50 over a backlog of
// 40,000 rows on 100 keys where every fourth row carries one of four quota
// keys: two with a quota that never refuses here (a high cap and a full
// bucket), one with a quota row and neither limit, one without a quota
// row. The rows taken stay running (the backlog outlasts the run).
// steps/op and bulk/op say whether the quota rows kept the batch on the
// bulk path.
func BenchmarkClaimBatchQuota(b *testing.B) {
	tb := setup(b)
	tb.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent, rate, burst) VALUES
		('q', 'qk-0', 1000000, NULL, NULL), ('q', 'qk-1', NULL, 1000000, 1000000), ('q', 'qk-2', NULL, NULL, NULL)`)
	fillBacklog(tb, 40000, `'k-' || r.pk % 100`, `CASE WHEN r.pk % 4 = 0 THEN 'qk-' || (r.pk / 4) % 4 ELSE '' END`, true)
	takeBatches(b, tb, claim.Request{Queue: "q", Worker: "w", Fair: true}, "harvest_claim_bulk_fair")
}

// BenchmarkClaimBatchRefusedHead times fair batches of 50 where rows
// carry a quota key whose bucket is empty for the whole run, so their
// keys' heads are refused in every batch and those keys never leave the
// candidates (never charged, their start tag is the clock, and their heads
// are the oldest rows). The rows taken stay running. steps/op and bulk/op
// say whether the refusals kept the batch on the bulk path. The shapes:
//   - one-of-400: 40,000 rows on 400 keys, every row of one key refused;
//   - one-of-20000: 40,000 rows on 20,000 keys (2 each), one key refused;
//   - 1000-refused, 20000-refused: 40,000 rows on 400 keys, none refused,
//     and 1,000 or 20,000 more keys of one row each, all refused: a tenant
//     whose own quota is full and whose starts each name a fairness key of
//     their own (how many it can hold is its admission limit).
func BenchmarkClaimBatchRefusedHead(b *testing.B) {
	benchRefusedShapes(b, false, []refusedShape{
		{"one-of-400", 40000, `'k-' || r.pk % 400`, `CASE WHEN r.pk % 400 = 0 THEN 'empty' ELSE '' END`},
		{"one-of-20000", 40000, `'k-' || r.pk % 20000`, `CASE WHEN r.pk % 20000 = 0 THEN 'empty' ELSE '' END`},
		{"1000-refused", 41000, `CASE WHEN r.pk <= 1000 THEN 'a-' || r.pk ELSE 'k-' || r.pk % 400 END`,
			`CASE WHEN r.pk <= 1000 THEN 'empty' ELSE '' END`},
		{"20000-refused", 60000, `CASE WHEN r.pk <= 20000 THEN 'a-' || r.pk ELSE 'k-' || r.pk % 400 END`,
			`CASE WHEN r.pk <= 20000 THEN 'empty' ELSE '' END`},
	})
}

// refusedShape is a backlog of a refused-head benchmark: n rows whose
// fairness and quota keys are SQL expressions over r.pk (1..n).
type refusedShape struct {
	name       string
	n          int
	key, quota string
}

// benchRefusedShapes runs takeBatches over each shape, in a two-level queue
// when twoLevel is set, with the quota key 'empty' refused throughout (a
// token every 10^6 s, none left).
func benchRefusedShapes(b *testing.B, twoLevel bool, shapes []refusedShape) {
	bulkFn := bulkStepFn(twoLevel)
	for _, sh := range shapes {
		b.Run(sh.name, func(b *testing.B) {
			tb := setup(b)
			if twoLevel {
				tb.exec(`SELECT harvest_queue_fairness_set('q', true, 'claims', 'bench')`)
			}
			tb.exec(`INSERT INTO quotas (queue, quota_key, rate, burst) VALUES ('q', 'empty', 0.000001, 1)`)
			tb.exec(`INSERT INTO rate_buckets (queue, quota_key, tokens, updated_at) VALUES ('q', 'empty', 0, now())`)
			fillBacklog(tb, sh.n, sh.key, sh.quota, true)
			takeBatches(b, tb, claim.Request{Queue: "q", Worker: "w", Fair: true}, bulkFn)
		})
	}
}

// stepCounter gives a test or benchmark its own connection, on which
// PL/pgSQL calls are counted from zero, and calls(fn): the calls of fn on
// it so far, which say how many single and bulk steps the batches took.
// Every call to count must be made on that connection: a server that
// tracks functions itself (track_functions in its configuration) would
// count other connections' calls too, whenever their statistics reach the
// view. The connection goes back to the pool when the test ends.
func stepCounter(b testing.TB, tb *bundle) (*pgxpool.Conn, func(fn string) float64) {
	conn, err := tb.db.Acquire(tb.ctx)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(conn.Release)
	for _, q := range []string{`SET track_functions = 'pl'`, `SELECT pg_stat_reset()`} {
		if _, err := conn.Exec(tb.ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	return conn, func(fn string) float64 {
		// Counts reach the statistics views once flushed.
		if _, err := conn.Exec(tb.ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
			b.Fatal(err)
		}
		var n float64
		if err := conn.QueryRow(tb.ctx, `SELECT coalesce(sum(calls), 0) FROM pg_stat_user_functions
			WHERE funcname = $1`, fn).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
}

// BenchmarkClaimBatchTwoLevel times fair batches of 50 in a two-level
// queue over a backlog of 40,000 rows: "tenants", 20 groups of 10 sub-keys
// each (one group weighs 3, one sub-key of another 2); "skew", the shape
// of BenchmarkClaimFairTwoLevel, one key with 90% of the rows and 500
// light keys, each key a group of its own. The rows taken stay running
// (the backlog outlasts the run). steps/op and bulk/op say how many single
// steps and two-level bulk steps (harvest_claim_bulk_group) a batch took.
func BenchmarkClaimBatchTwoLevel(b *testing.B) {
	shapes := []struct{ name, key string }{
		{"tenants", `'t' || r.pk % 20 || '/k' || (r.pk / 20) % 10`},
		{"skew", `CASE WHEN r.pk % 10 = 0 THEN 'light-' || (r.pk / 10) % 500 ELSE 'heavy' END`},
	}
	for _, shape := range shapes {
		b.Run(shape.name, func(b *testing.B) {
			tb := setup(b)
			tb.exec(`SELECT harvest_queue_fairness_set('q', true, 'claims', 'bench')`)
			tb.exec(`SELECT harvest_group_weight_set('q', 't3', 3, 'bench')`)
			tb.exec(`INSERT INTO weight_overrides (queue, key, weight) VALUES ('q', 't5/k1', 2)`)
			fillBacklog(tb, 40000, shape.key, `''`, true)
			takeBatches(b, tb, claim.Request{Queue: "q", Worker: "w", Fair: true}, "harvest_claim_bulk_group")
		})
	}
}

// fillBacklog enqueues n rows in queue q, one run each, due a millisecond
// apart in run order, with the fairness key and the quota key given as SQL
// expressions over the run's pk (r.pk); with fair set it builds the keys'
// summary, as arrivals would have. The arrival trigger is off while the
// rows go in, and the tables are analysed after.
func fillBacklog(tb *bundle, n int, key, quota string, fair bool) {
	tb.exec(`ALTER TABLE tasks DISABLE TRIGGER tasks_arrive_insert`)
	tb.exec(`INSERT INTO runs (tenant, id, name, queue, request_hash)
		SELECT 't1', g::text, 'wf', 'q', '\x00' FROM generate_series(1, $1::integer) g`, n)
	tb.exec(`INSERT INTO tasks (run_pk, queue, fairness_key, quota_key, due_at)
		SELECT r.pk, 'q', ` + key + `, ` + quota + `,
		       timestamptz '2026-01-01 00:00:00+00' + r.pk * interval '1 millisecond'
		FROM runs r`)
	tb.exec(`ALTER TABLE tasks ENABLE TRIGGER tasks_arrive_insert`)
	if fair {
		tb.exec(`SELECT harvest_fair_repair('q')`)
	}
	tb.exec(`VACUUM ANALYZE tasks`)
	tb.exec(`VACUUM ANALYZE runs`)
}

// takeBatches claims batches of 50 with req until the benchmark ends, each
// of them full (the rows taken stay running: the backlog must outlast the
// run), and reports the single steps (steps/op) and the calls of the bulk
// step bulkFn (bulk/op) a batch took.
func takeBatches(b *testing.B, tb *bundle, req claim.Request, bulkFn string) {
	conn, calls := stepCounter(b, tb)
	i := 0
	b.ResetTimer()
	for b.Loop() {
		i++
		rs, err := claim.ClaimBatch(tb.ctx, conn, req, 50)
		if err != nil {
			b.Fatal(err)
		}
		if len(rs) < 50 {
			b.Fatalf("batch %d took %d rows", i, len(rs))
		}
	}
	b.StopTimer()
	if i > 0 {
		b.ReportMetric(calls("harvest_claim_step")/float64(i), "steps/op")
		b.ReportMetric(calls(bulkFn)/float64(i), "bulk/op")
	}
}

// BenchmarkClaimBatchTwoLevelRefusedHead is BenchmarkClaimBatchRefusedHead
// in a two-level queue: fair batches of 50 over 40,000 rows on 20 groups
// of 10 sub-keys, where every row of one sub-key (t0/k0) carries a quota
// key whose bucket is empty for the whole run. That key is never charged,
// so its lag within its group stays 0, and every claim that reaches its
// head before the row it takes (the claims of group t0, and of the groups
// whose lag is not below t0's) refuses it. The rows taken stay running.
// steps/op and bulk/op say whether the refusal kept the batch on the bulk
// path (harvest_claim_bulk_group). The shapes 1000-refused and
// 20000-refused add the one-level benchmark's many refused keys, as one
// group of sub-keys.
func BenchmarkClaimBatchTwoLevelRefusedHead(b *testing.B) {
	benchRefusedShapes(b, true, []refusedShape{
		{"one-sub-key", 40000, `'t' || r.pk % 20 || '/k' || (r.pk / 20) % 10`,
			`CASE WHEN r.pk % 200 = 0 THEN 'empty' ELSE '' END`},
		// The one-level benchmark's many refused keys, as the sub-keys of
		// one group.
		{"1000-refused", 41000,
			`CASE WHEN r.pk <= 1000 THEN 'a/' || r.pk ELSE 't' || r.pk % 20 || '/k' || (r.pk / 20) % 10 END`,
			`CASE WHEN r.pk <= 1000 THEN 'empty' ELSE '' END`},
		{"20000-refused", 60000,
			`CASE WHEN r.pk <= 20000 THEN 'a/' || r.pk ELSE 't' || r.pk % 20 || '/k' || (r.pk / 20) % 10 END`,
			`CASE WHEN r.pk <= 20000 THEN 'empty' ELSE '' END`},
	})
}

// BenchmarkClaimRefusedHeadManyKeys times single fair claims over 40,000
// rows on 20,000 keys (2 each; in the two-level queue, 200 groups of 100
// sub-keys) whose oldest key's rows all carry a quota key with an empty
// bucket: every claim picks that key's head first, has it refused, and
// picks again among the other keys. The rows taken stay running. What the
// second pick costs is what this measures: it should find the next key in
// the fair order, not read every key's first row.
func BenchmarkClaimRefusedHeadManyKeys(b *testing.B) {
	for _, twoLevel := range []bool{false, true} {
		b.Run(fmt.Sprintf("two-level=%v", twoLevel), func(b *testing.B) {
			tb := setup(b)
			if twoLevel {
				tb.exec(`SELECT harvest_queue_fairness_set('q', true, 'claims', 'bench')`)
			}
			tb.exec(`INSERT INTO quotas (queue, quota_key, rate, burst) VALUES ('q', 'empty', 0.000001, 1)`)
			tb.exec(`INSERT INTO rate_buckets (queue, quota_key, tokens, updated_at) VALUES ('q', 'empty', 0, now())`)
			fillBacklog(tb, 40000, `'g' || r.pk % 200 || '/k-' || r.pk % 20000`,
				`CASE WHEN r.pk % 20000 = 1 THEN 'empty' ELSE '' END`, true)
			req := claim.Request{Queue: "q", Worker: "w", Fair: true}
			b.ResetTimer()
			for b.Loop() {
				res, err := claim.Claim(tb.ctx, tb.db, req)
				if err != nil {
					b.Fatal(err)
				}
				if !res.OK || len(res.Refused) != 1 {
					b.Fatalf("claim: ok %v with %d refusals, want a task and one refusal", res.OK, len(res.Refused))
				}
			}
		})
	}
}
