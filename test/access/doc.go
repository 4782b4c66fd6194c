// Package access checks who may do what: every HTTP route of the gateway
// against every privilege, a missing or unknown token and another tenant's
// token; and, against a real NATS server running the shipped configuration
// (deploy/nats/nats.conf), that a tenant can neither start runs on another
// tenant's subjects nor hear another tenant's run events.
package access
