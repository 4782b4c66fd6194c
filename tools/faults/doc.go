// Package faults holds the fault tests: each starts a small fleet of real
// gateway and worker processes (internal/soak), drives a load of starts from
// several tenants over HTTP and NATS, breaks one thing, lets the fleet drain
// and then checks every invariant Harvest promises (see docs/reliability.md).
package faults
