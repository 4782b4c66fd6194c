// Command gateway serves Harvest's HTTP API and NATS start service. Run it
// with --help for the environment variables it reads.
package main

import (
	"os"

	"github.com/harvest-run/harvest/internal/gateway"
)

func main() {
	os.Exit(gateway.Main(os.Args[1:], os.Stdout, os.Stderr))
}
