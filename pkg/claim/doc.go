// Package claim holds the statements a worker uses to take work from its
// shard and to report on it: the fair claim (weighted start-time fair
// queuing over fairness keys), the ordinary claim, the claim of a named row
// (dispatch), the batched claim, and the lease-fenced completion, failure,
// heartbeat and continuation of a claimed task. It also holds the upkeep:
// promotion of scheduled rows, rescue of expired leases, and the prune and
// repair of fairness state.
//
// The heavy lifting is done by PL/pgSQL functions of the shard's schema
// (internal/schema/functions), so a claim is one round trip: promote due
// rows, pick, run the quota rechecks (with a bounded refusal loop), lease
// the row and charge its key. The statements this package sends are
// embedded from sql/*.sql.
//
// The fair claims of a queue take turns on the queue's fair lock, so they
// follow the reference model of pkg/fairkeys in the order they take it,
// whatever the number of claimers. The fair claim never reads the backlog:
// each (queue, key) row of fair_state carries, besides its pass and
// last_start, the key's head (its first pending row), and the best key is
// the better of two index descents on that table. Starts never write those
// rows; they append new work to fair_arrivals, which the next fair claim
// folds in. A Claimer combines the fair claims of one process into one turn.
// See docs/claim.md for the whole design and docs/benchmarks.md for costs.
//
// Every function accepts a DB: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
// Errors raised by the database for a stale lease or a missing task come
// back as ErrStaleLease and ErrNotFound (test with errors.Is).
package claim
