// Package soak runs a small Harvest fleet as real processes and breaks it on
// purpose.
//
// A Fleet is one embedded NATS server (owned by the fleet, so it can be
// stopped and started again on the same port), one TCP proxy in front of each
// Postgres shard (so a shard can be cut off, slowed down or flapped without
// touching the shared server), a number of gateway processes and a number of
// worker processes per shard. A Load drives starts from several tenants over
// HTTP and NATS; a start that gets no answer is sent again with the same id
// until a gateway acknowledges it. The fault functions (faults.go) break one
// thing at a time, and Check (check.go) verifies, once the fleet has drained,
// the promises Harvest makes: no acknowledged start is lost, every run ends in
// one final state, attempts stay within their bound, completions are fenced by
// the lease, running counts match a recount and the fairness clock never
// moves back.
//
// The fault tests under tools/faults, `harvest-bench soak` and `harvest-bench
// mix` (mixbench.go: the soak's load with no fault, on a fleet that runs on
// the shipped defaults, Options.Shipped) all use this package, so the
// harness exists once.
package soak
