package claim_test

import (
	"testing"

	"github.com/harvest-run/harvest/pkg/claim"
)

// BenchmarkOrdinaryBatchQuota is BenchmarkClaimBatchQuota for ordinary
// batches: batches of 50 over a backlog of 40,000 rows where every fourth
// row carries one of four quota keys (two with a quota that never refuses
// here, a high cap and a full bucket; one with a quota row and neither
// limit; one without a quota row). The rows taken stay running. steps/op
// and bulk/op say whether the quota rows kept the batch on the bulk path.
func BenchmarkOrdinaryBatchQuota(b *testing.B) {
	tb := setup(b)
	tb.exec(`ALTER TABLE tasks DISABLE TRIGGER tasks_arrive_insert`)
	tb.exec(`INSERT INTO runs (tenant, id, name, queue, request_hash)
		SELECT 't1', g::text, 'wf', 'q', '\x00' FROM generate_series(1, 40000) g`)
	tb.exec(`INSERT INTO tasks (run_pk, queue, fairness_key, quota_key, due_at)
		SELECT r.pk, 'q', 'k-' || r.pk % 100,
		       CASE WHEN r.pk % 4 = 0 THEN 'qk-' || (r.pk / 4) % 4 ELSE '' END,
		       timestamptz '2026-01-01 00:00:00+00' + r.pk * interval '1 millisecond'
		FROM runs r`)
	tb.exec(`ALTER TABLE tasks ENABLE TRIGGER tasks_arrive_insert`)
	tb.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent, rate, burst) VALUES
		('q', 'qk-0', 1000000, NULL, NULL), ('q', 'qk-1', NULL, 1000000, 1000000), ('q', 'qk-2', NULL, NULL, NULL)`)
	tb.exec(`VACUUM ANALYZE tasks`)
	tb.exec(`VACUUM ANALYZE runs`)
	conn, calls := stepCounter(b, tb)
	req := claim.Request{Queue: "q", Worker: "w"}
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
		b.ReportMetric(calls("harvest_claim_bulk")/float64(i), "bulk/op")
	}
}
