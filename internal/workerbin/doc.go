// Package workerbin is the stock worker binary (cmd/worker): configuration
// from the environment, the demo handlers (echo, sleep, fail, steps; only
// with HARVEST_WORKER_DEMO_HANDLERS=true, or in harvest dev) and the NATS
// handler bridge that serves every other workflow name through users'
// services over request-reply.
package workerbin
