// Command worker claims and runs the tasks of one Harvest shard. Run it
// with --help for the environment variables it reads.
package main

import (
	"os"

	"github.com/harvest-run/harvest/internal/workerbin"
)

func main() {
	os.Exit(workerbin.Main(os.Args[1:], os.Stdout, os.Stderr))
}
