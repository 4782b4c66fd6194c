// Package metrics holds the test that scrapes a worker's /metrics and
// finds the instruments operators chart: claims, claim latency, queue
// depth and unfinished runs, with bounded labels only.
package metrics
