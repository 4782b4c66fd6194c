// Package api defines the resources of Harvest's HTTP and NATS API: the start
// request, the run, the error, and the rules a start must satisfy.
//
// The JSON field names, status codes and error codes here are a contract that
// clients and scripts rely on; the gateway, the Go client and the CLI all use
// these types so they cannot drift apart.
package api
