// Package startbench measures the start path.
//
// harvest-bench starts (startbench.go) measures how many starts per second
// one gateway takes and how long each waits for its answer, over HTTP and
// over NATS, with a number of concurrent clients in closed loops. It
// brings its own world: a fresh database on the given PostgreSQL server
// (dropped afterwards), an embedded NATS server unless one is named, and a
// gateway in the same process. The admission hook is left out, as the
// system limit of admission would be raised out of the way anyway.
//
// harvest-bench sustain (sustain.go) offers single starts of echo at a
// rising rate, over HTTP and over NATS, to a fleet of processes it starts
// itself (fleet.go: shard databases, an embedded NATS server, gateway and
// worker binaries on their defaults), reads each step's start-to-claim
// waits from the shards, and reports the highest rate that holds; with
// River (bench/river, river-bench sustain) driven the same way beside it
// (river.go). Its --overload mode (overload.go) offers several times a
// given capacity, kills a gateway on the way, and reports goodput, the
// refused starts' answer times, the restarted gateway's time to ready, and
// whether every acknowledged start was claimed.
package startbench
