// Package metrics holds the tests that scrape the /metrics page of a real
// worker binary and a real gateway binary: the instruments operators chart
// (claims, claim latency, queue depth, unfinished runs, HTTP requests)
// with bounded labels only, the Go runtime, process, Postgres pool and
// NATS connection series, and a page that passes promlint.
package metrics
