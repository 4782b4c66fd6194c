// Package startbench measures how many starts per second one gateway takes
// and how long each waits for its answer, over HTTP and over NATS, with a
// number of concurrent clients (harvest-bench starts).
//
// It brings its own world: a fresh database on the given PostgreSQL server
// (dropped afterwards), an embedded NATS server unless one is named, and a
// gateway in the same process, so a run needs nothing set up by hand. The
// admission hook is left out, as the system limit of admission would be
// raised out of the way anyway.
package startbench
