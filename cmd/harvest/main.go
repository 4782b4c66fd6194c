// Command harvest is the operator's command-line tool: migrations, weights,
// quotas, admission, runs (get, list, cancel), prune, the local dev fleet,
// the demos and its version (harvest version or --version).
package main

import (
	"os"

	"github.com/harvest-run/harvest/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
