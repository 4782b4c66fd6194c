// Package movebench measures what moving a tenant between shards costs:
// the move's time, and what another tenant flooding the old home sees of
// it (its start latency before and during the move, and the statements
// found waiting on a lock on the old home meanwhile).
package movebench
