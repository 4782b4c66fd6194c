package weights

import "github.com/harvest-run/harvest/pkg/api"

// The answers of the weight, quota, key and audit routes are wire types of
// pkg/api, so that a client reads them without linking this package (and
// its database driver). These names keep them at hand here.
type (
	// ShardOutcome is one shard's part of a write.
	ShardOutcome = api.ShardOutcome
	// WriteResult is the answer to a weight write.
	WriteResult = api.WeightWriteResult
	// KeyWeight is one key's weight on one shard.
	KeyWeight = api.KeyWeight
	// ShardWeights is one shard's detail in a weights read.
	ShardWeights = api.ShardWeights
	// ReadResult is the answer to a weights read.
	ReadResult = api.WeightReadResult
	// Override is one key's weight override.
	Override = api.WeightOverride
	// QuotaEntry is one quota key's quota.
	QuotaEntry = api.QuotaEntry
	// KeyView is one key of the per-key view.
	KeyView = api.KeyView
	// ShardKeyList is one shard's per-key view of a queue.
	ShardKeyList = api.ShardKeyList
	// AuditEntry is one audit row.
	AuditEntry = api.AuditEntry
	// AuditPage is one page of the audit log.
	AuditPage = api.AuditPage
	// QuotaWriteResult is the answer to a quota write.
	QuotaWriteResult = api.QuotaWriteResult
	// ShardQuotas is one shard's detail in a quotas read.
	ShardQuotas = api.ShardQuotas
	// QuotaReadResult is the answer to a quotas read.
	QuotaReadResult = api.QuotaReadResult
	// ShardKeys is one shard's part of the per-key view.
	ShardKeys = api.ShardKeys
	// KeysResult is the answer to a per-key view read.
	KeysResult = api.KeysResult
	// Quota is the rechecks of one (queue, quota key).
	Quota = api.Quota
	// WeightBody is the body of a weight write.
	WeightBody = api.WeightBody
)

// Outcomes of a write on one shard, as they appear in the shards list of
// a write's answer.
const (
	OutcomeOK          = api.ShardOutcomeOK
	OutcomeUnavailable = api.ShardOutcomeUnavailable
	OutcomeCapReached  = api.ShardOutcomeCapReached
	OutcomeError       = api.ShardOutcomeError
)

// Limits of quota settings (see api.QuotaMaxConcurrent).
const (
	MaxConcurrentLimit = api.QuotaMaxConcurrent
	MaxRate            = api.QuotaMaxRate
	MaxBurst           = api.QuotaMaxBurst
)

// quotaEqual reports whether two quotas set the same limits.
func quotaEqual(q, o Quota) bool {
	eqI := func(a, b *int) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
	eqF := func(a, b *float64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
	return eqI(q.MaxConcurrent, o.MaxConcurrent) && eqF(q.Rate, o.Rate) && eqF(q.Burst, o.Burst)
}
