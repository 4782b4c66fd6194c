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
	tb.exec(`INSERT INTO quotas (queue, quota_key, max_concurrent, rate, burst) VALUES
		('q', 'qk-0', 1000000, NULL, NULL), ('q', 'qk-1', NULL, 1000000, 1000000), ('q', 'qk-2', NULL, NULL, NULL)`)
	fillBacklog(tb, 40000, `'k-' || r.pk % 100`, `CASE WHEN r.pk % 4 = 0 THEN 'qk-' || (r.pk / 4) % 4 ELSE '' END`, false)
	takeBatches(b, tb, claim.Request{Queue: "q", Worker: "w"}, "harvest_claim_bulk")
}
