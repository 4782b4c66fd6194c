package claim_test

import (
	"testing"

	"github.com/harvest-run/harvest/pkg/claim"
)

// The Go benchmarks measure one claim (one statement, autocommit) over a
// skewed backlog of 50,000 rows: one key with 90%, 500 light keys. For the
// full matrix use `harvest-bench claim` (docs/benchmarks.md).
//
// modes, when not empty, sets the queue's fairness modes first
// (harvest_queue_fairness_set's two_level and charge).
func benchClaim(b *testing.B, fair bool, aging int, modes ...any) {
	tb := setup(b)
	if len(modes) == 2 {
		tb.exec(`SELECT harvest_queue_fairness_set('q', $1, $2, 'bench')`, modes...)
	}
	// The fill skips the arrival record and builds the heads once, as
	// `harvest-bench claim` does; claims then see a settled queue.
	tb.exec(`ALTER TABLE tasks DISABLE TRIGGER tasks_arrive_insert`)
	tb.exec(`INSERT INTO runs (tenant, id, name, queue, request_hash)
		SELECT 't1', g::text, 'wf', 'q', '\x00' FROM generate_series(1, 50000) g`)
	tb.exec(`INSERT INTO tasks (run_pk, queue, fairness_key, due_at)
		SELECT r.pk, 'q', CASE WHEN r.pk % 10 = 0 THEN 'light-' || (r.pk / 10) % 500 ELSE 'heavy' END,
		       timestamptz '2026-01-01 00:00:00+00' + r.pk * interval '1 millisecond'
		FROM runs r`)
	tb.exec(`ALTER TABLE tasks ENABLE TRIGGER tasks_arrive_insert`)
	tb.exec(`SELECT harvest_fair_repair('q')`)
	tb.exec(`VACUUM ANALYZE tasks`)
	tb.exec(`VACUUM ANALYZE runs`)
	req := claim.Request{Queue: "q", Worker: "w", Fair: fair, AgingSecs: aging}
	b.ResetTimer()
	for b.Loop() {
		r, err := claim.Claim(tb.ctx, tb.db, req)
		if err != nil {
			b.Fatal(err)
		}
		if !r.OK {
			b.StopTimer()
			tb.exec(`UPDATE tasks SET state = 'pending', charged_secs = NULL WHERE state = 'running'`)
			b.StartTimer()
		}
	}
}

func BenchmarkClaimFair(b *testing.B)           { benchClaim(b, true, 0) }
func BenchmarkClaimOrdinary(b *testing.B)       { benchClaim(b, false, 0) }
func BenchmarkClaimFairAgeing(b *testing.B)     { benchClaim(b, true, 60) }
func BenchmarkClaimOrdinaryAgeing(b *testing.B) { benchClaim(b, false, 60) }

// The modes: two-level compares every key with work on each claim (here
// 501), runtime bills an estimate (each claim's row stays running, so
// nothing is settled here).
func BenchmarkClaimFairTwoLevel(b *testing.B) { benchClaim(b, true, 0, true, "claims") }
func BenchmarkClaimFairRuntime(b *testing.B)  { benchClaim(b, true, 0, false, "runtime") }
