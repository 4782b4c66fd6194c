// Package dberr is where Harvest reads the errors of its database: the
// SQLSTATE codes it interprets, each named once, and the few questions
// every package asks of a failed statement.
//
//   - Conflict: the database broke the transaction to end a lock cycle or
//     a serialization conflict (40P01, 40001). Nothing of it was written,
//     and the same transaction sent again is likely to succeed.
//   - Retryable: Conflict, or a write refused whole by a server that is no
//     longer the primary (25006). A new transaction is safe; after 25006
//     the pool has dropped the connection (internal/pgpool), so the next
//     attempt reaches the new primary or fails to connect. Background work
//     with nobody to hand a 503 to (a tenant move, deferred starts) retries
//     on it; the request paths answer 503 instead and use Conflict.
//   - Unavailable: the shard did not answer, or answered that it cannot
//     serve now (connection failures, shutdown, read-only, out of
//     connections or other resources), as opposed to refusing the
//     statement. The gateway answers 503 with Retry-After, pkg/weights
//     ErrUnavailable.
//   - Unreachable: nothing answered at the address at all, as opposed to a
//     server that said no; the test harness and harvest dev start a
//     throwaway server only then.
//   - PrimaryLost: after this code the connection's server can no longer be
//     taken for the writable primary (internal/pgpool retires the pool's
//     connections).
//
// Harvest raises codes of its own, class HA, from its SQL functions
// (internal/schema/functions). Each is turned into Go errors by exactly
// one package, in that package's one mapping function:
//
//	code   raised by                          becomes
//	HA001  harvest_leased, harvest_outcome_one  pkg/claim ErrStaleLease
//	HA002  harvest_leased, harvest_outcome_one  pkg/claim ErrNotFound
//	HA011  harvest_start_group                  nothing: caught in the same function
//	HA020  harvest_tenant_fence                 internal/runstore *MovedError
//	HA021  harvest_run_cancel                   internal/runstore ErrRunMoving
//
// The sentinels stay with the packages whose callers match them (pkg/claim's
// are public API, and nothing of this package shows in pkg/'s exported
// identifiers); what is here is the codes and the classes, so that no
// package of the product spells a SQLSTATE or keeps a list of network
// errors of its own.
package dberr
