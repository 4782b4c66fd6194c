// Package tenantcap decides whether a tenant may start one more run.
//
// Every run counts against two limits from the moment it is admitted until
// it reaches a final state:
//
//   - the system limit, max_runs (HARVEST_MAX_RUNS, 128 unless set), on the
//     number of unfinished runs of all tenants together. No API changes it;
//   - a per-tenant limit that follows the algorithm an administrator picked:
//     no_limit (none beyond the system limit), static (an equal share of
//     max_runs scaled by the tenant fairness multiplier, TFM) or dynamic (a
//     multiple of the capacity still free, re-evaluated at every start).
//
// The pure part (Algorithm, Config, Limit, Decide) holds the rules. The rest
// binds them to the shards:
//
//   - Admitter.Rule gives the rule (Rule) that the statement writing a
//     start group applies to each of its new runs under the shard's locks;
//     Rule.Judge is the same decision in Go, which Admitter.Admit and Check
//     use for the starts written one at a time (deferred starts, retries),
//     inside their transaction on the tenant's home shard.
//   - Totals caches the number of unfinished runs of every shard, refreshed
//     at a fixed interval; Admit adds the exact figure of its own shard to
//     the cached figures of the others. See docs/admission.md for the bound
//     this puts on overshooting max_runs.
//   - LoadConfig, UpdateConfig and ApplyPut keep the configuration in the
//     settings table of shard 0 with an audit row for every change and every
//     refused change; PublishChange and Watcher carry a change to every
//     gateway (NATS first, a periodic reload as the fallback).
//   - Recount heals the per-tenant counts from the runs table after a
//     crash, and the shard's total of them (shard_running) from the counts.
//   - BuildAdmissionView and Admitter.Usage build the bodies of
//     GET /v1/admission and GET /v1/usage; ParsePut reads PUT /v1/admission.
//
// # Where each part of admission lives
//
// This package is the one home of admission: every rule and every
// decision is here. The algorithms are in algorithm.go, the rule a start
// statement applies in rule.go, the hook the start path asks (Admission,
// Hook, Ruler) in hook.go, the Admitter in admitter.go, the shard totals in
// totals.go, the capacity leases in leases.go, the configuration in
// settings.go, store.go and watcher.go, the priority ceilings in
// priority.go, the recount in recount.go and the route bodies in view.go.
// The wire types it takes and returns are pkg/api's (api.Algorithm and its
// constants, api.AdmissionView, api.UsageView), used under those names.
//
// Outside it there is only wiring and the SQL side of the rule:
//
//   - internal/gateway/admission.go builds a gateway's Admitter, Totals,
//     Leases and Watcher over its pools and runs them for the gateway's
//     life, refuses new runs with 503 until the configuration was read
//     from shard 0, counts decisions in the harvest.gateway.admission.decisions
//     metric, and gives the committers a Hook that is also a Ruler;
//   - internal/runstore (the committer and Retry) and internal/deferred
//     ask that Hook inside the start transaction, by the names of this
//     package (tenantcap.Hook, tenantcap.Admission, tenantcap.Ruler);
//   - the start statement judges a group by the Rule in SQL:
//     harvest_start_group.sql, harvest_admission_rule.sql,
//     harvest_admission_decide.sql and harvest_admission_dynamic_limit.sql
//     under internal/schema/functions, with the shard's admission lock
//     (harvest_shard_admission_lock.sql) and lease
//     (harvest_shard_lease.sql).
package tenantcap
