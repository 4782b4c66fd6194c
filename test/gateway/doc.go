// Package gateway holds cross-package tests of the gateway: a gateway run
// as the binary runs it (gateway.Run with its environment configuration)
// behind the NATS server configuration shipped in deploy/nats, driven the
// way a new user would drive it.
package gateway
