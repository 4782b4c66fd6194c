// Package claim holds the statements a worker uses to take work from its
// shard and to report on it: the fair claim (weighted start-time fair
// queuing over fairness keys), the ordinary claim, the claim of a named row
// (dispatch), the batched claim, and the lease-fenced completion, failure,
// heartbeat and continuation of a claimed task. It also holds the upkeep:
// promotion of scheduled rows, rescue of expired leases and the prune of
// fairness state.
//
// The heavy lifting is done by PL/pgSQL functions that the schema
// migrations install (internal/schema/migrations/0002_claim.sql), so a claim
// is one round trip: promote due rows, pick, run the quota rechecks (with a
// bounded refusal loop), lease the row and charge its key. The statements
// this package sends are embedded from sql/*.sql.
//
// The fair claim never reads the backlog. Each (queue, key) row of
// fair_state carries, besides its pass and last_start, the head of the key
// (the first due pending row in the claim order) and a mark in_debt
// (pass > V). The best key is the better of two index descents on that
// table: the best key without debt by its head, and the best key in debt by
// head priority then pass. The key's head row is then read from an index
// that matches the claim order inside a key. A trigger on tasks keeps every
// head exact, whatever statement moves a row in or out of the pending state.
// See docs/claim.md for the whole design and docs/benchmarks.md for costs.
//
// Every function accepts a DB: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
// Errors raised by the database for a stale lease or a missing task come
// back as ErrStaleLease and ErrNotFound (test with errors.Is).
package claim
