// Package client tests pkg/client against a real gateway over PostgreSQL
// and NATS: the behaviour that needs the gateway's answers, such as a
// retried start replaying its run, rather than the header and retry
// mechanics that pkg/client's own tests check against a stand-in.
package client
