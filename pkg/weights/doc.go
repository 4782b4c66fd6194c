// Package weights holds the operator settings of fairness: weight
// overrides of fairness keys and quotas (concurrency cap, rate limit) of
// quota keys.
//
// Two layers:
//
//   - One-shard functions (SetOne, ClearOne, List, SetQuotaOne,
//     ClearQuotaOne, ListQuotas, KeysOne, AuditList) act on the shard of
//     the pool, connection or transaction passed in. Each write is one
//     statement that makes the change, enforces the per-queue cap of
//     MaxOverrides under the queue's writer lock and writes the audit row,
//     so a change and its audit row commit together; a refusal at the cap
//     is audited too.
//   - Fan-out functions (Set, Clear, Get, SetQuota, ClearQuota, GetQuota,
//     Keys) run the one-shard function on every shard at once and fold the
//     per-shard outcomes into the answer of the HTTP route: each result has
//     a Status method (200, 207, 409, 503) and marshals to the route's
//     body. Their error is non-nil only for invalid arguments (an
//     *api.Error with status 400), before any shard is touched.
//
// The answers and bodies are pkg/api's wire types, under the names pkg/api
// gives them (api.WeightWriteResult, api.Quota, api.QuotaReadResult,
// api.KeysResult, api.ShardOutcome, ...): a client reads them without
// linking this package and its database driver, and grep finds every use.
//
// The claim reads weights and quotas at each claim, so a change applies at
// the next claim without any signal; the change event published with
// WithNATS is only a hint for caches.
package weights
