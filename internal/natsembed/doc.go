// Package natsembed runs a NATS server with JetStream inside the current
// process, for tests and for `harvest dev`.
//
// The server listens on 127.0.0.1 (on a random port unless one is asked
// for), keeps its JetStream files in a temporary directory that Shutdown
// removes, installs no signal handlers and logs nothing unless asked to.
// An optional nats-server configuration file supplies everything else,
// such as accounts and per-tenant permissions.
package natsembed
