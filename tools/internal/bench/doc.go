// Package bench holds Harvest's benchmarks that run against a real
// PostgreSQL server. ClaimBench measures the claim of pkg/claim: the whole
// claim transaction and the pick alone, fair against ordinary, over a
// skewed backlog; `harvest-bench claim` drives it.
package bench
