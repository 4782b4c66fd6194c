// Package pgcluster runs a disposable PostgreSQL server for tests and for
// `harvest dev`.
//
// Start creates a fresh data directory with initdb, starts the server on a
// free loopback port with pg_ctl, and returns a Cluster that knows how to
// reach it and how to tear it down. Everything the server writes (data,
// socket, log) lives under one temporary directory that Stop removes.
//
// The cluster favours speed over durability: by default fsync and the
// related settings are off, so a crash of the machine loses the data, which
// is the point of a throwaway server.
//
// StartStandby makes a streaming standby of a running cluster with
// pg_basebackup (synchronous or not), Promote ends its recovery, and Kill
// stops a server at once as a crash would: the fault suite's failover
// tests run a shard on such a pair.
//
// PostgreSQL will not run as root. When the calling process is root, the
// server binaries are run as an unprivileged operating-system user instead
// (see Options.OSUser); the user is created when it does not exist yet.
package pgcluster
