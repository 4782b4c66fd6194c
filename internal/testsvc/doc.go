// Package testsvc gives tests a PostgreSQL database and a NATS server
// without any setup by hand.
//
// Every package whose tests use the database must route its TestMain
// through this package, so that a server started on the tests' behalf is
// stopped when they finish:
//
//	func TestMain(m *testing.M) { testsvc.Main(m) }
//
// # PostgreSQL
//
// Tests use the server named by HARVEST_TEST_DATABASE_URL (by default
// postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable), connecting
// as a role allowed to create and drop databases. The server is probed once
// per test process. When nothing answers there, the package starts one
// throwaway server with pgcluster for the whole process instead, so a
// machine with the PostgreSQL server binaries installed needs no running
// database at all. A server that answers but refuses the connection (bad
// password, missing database) is an error, not a reason to fall back.
//
// NewDB, NewDBURL and NewEmptyDBURL each create a database with a random
// name that is dropped when the test ends, so tests never see each other's
// data or what an earlier run left behind. The name carries the test
// process's id: a process killed before its cleanups ran (a fuzzing worker
// the engine stopped, a binary killed at its timeout) leaves its databases
// behind, and the next test process to make its migrated template drops
// those of processes that are gone.
//
// # NATS
//
// NATSURL starts an embedded NATS server with JetStream for the calling
// test, unless HARVEST_TEST_NATS_URL names an external server to share. On
// a shared server tests must keep to subjects and stream names of their
// own, for instance built with RandomName.
package testsvc
