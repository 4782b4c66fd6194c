// Command harvest is the operator's command-line tool: migrations, weights,
// quotas, admission, runs, prune, the local dev fleet and benchmarks.
package main

import (
	"os"

	"github.com/harvest-run/harvest/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
