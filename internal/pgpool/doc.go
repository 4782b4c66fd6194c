// Package pgpool opens every connection pool Harvest's binaries keep on a
// shard, so that a shard whose primary is replaced (a crash and a standby
// promoted, a planned switchover, a managed service's failover) is
// followed without a restart.
//
// A shard URL may name several hosts (postgres://u@a:5432,b:5432/db).
// pgx then tries them in order for each new connection, and with
// target_session_attrs=read-write keeps only a server that accepts writes.
// New asks for that target whenever the URL and PGTARGETSESSIONATTRS say
// nothing, so a new connection never lands on a standby.
//
// That covers new connections only. A pooled connection made before the
// switch may still talk to the old primary: dead (its next statement fails
// and pgxpool drops it), or alive but now read-only, where every write
// fails with SQLSTATE 25006 and pgxpool would hand the same connection out
// again and again (what kept River's leader on a read-only Aurora node
// until a restart, riverqueue/river#1225). So a pool from New closes a
// connection on its first 25006, and when a connection finds its server
// read-only or shutting down (25006, 57P01, 57P02, 57P03, or the server's
// own report that default_transaction_read_only turned on, which
// PostgreSQL 14 and later send with the answer to any statement) it
// retires every connection the pool opened before that moment: the idle
// ones are closed at once, the busy ones when released. The connections
// that replace them go through target_session_attrs again, to the new
// primary. Ping, for readiness probes, asks the server whether it takes
// writes, since a ping alone passes on a read-only one.
//
// Each reset counts once in harvest.pgx.pool.resets (by shard). The
// statements that failed are classified as "unavailable, try again" by the
// packages that ran them (the gateway answers 503 with Retry-After; nothing
// of a refused transaction was written).
package pgpool
