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
package tenantcap
