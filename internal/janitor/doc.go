// Package janitor keeps a shard healthy in the background: it puts back
// tasks whose lease ran out, makes scheduled tasks claimable when they fall
// due, recounts each tenant's unfinished runs, deletes finished runs once
// they are older than the retention period and audit rows once they are
// older than the audit retention, fires the deferred starts
// (throttle, debounce, batch) whose time came and prunes the finished ones,
// and, while the rate-limit bucket GC is on, drops idle rate buckets and
// idle fairness state. Where the server's autovacuum is off or lags, it
// also analyzes the tables written far past their statistics, so that the
// plans connections keep are made again for the tables as they are.
//
// Any number of janitors may run against one shard at once (every worker
// runs one by default). The rescue, the promotion and the firing of
// deferred starts skip rows another janitor holds; the other jobs run in
// one transaction guarded by a transaction-level advisory lock, so on each
// tick one janitor does them and the others skip them.
//
// Lease expiry is judged by the database clock only, so clock drift
// between worker hosts cannot rescue a task early.
package janitor
