// Package dispatch names the NATS subjects Harvest uses and encodes the names
// placed in them.
//
// NATS carries hints and requests only: wake-ups, the dispatch channel, weight
// events, run events and starts. Postgres stays the source of truth, so a
// message that is lost costs latency, never a task.
//
// A queue name, workflow name or run id may hold bytes that mean something in
// a subject ('.', '*', '>', spaces). Each such name becomes exactly one token:
// every byte outside [A-Za-z0-9_-] is written as %XX (upper-case hex), so
// "orders.eu" becomes "orders%2Eeu". The encoding is reversible and the same
// for every client.
package dispatch
