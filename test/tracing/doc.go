// Package tracing holds the end-to-end tracing test: one start through a
// real gateway and a real worker, against real Postgres and NATS, must
// make one connected trace.
package tracing
