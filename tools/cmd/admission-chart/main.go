// Command admission-chart writes docs/admission-limits.svg: the per-tenant limit of
// each admission algorithm against the system's load.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"

	"github.com/harvest-run/harvest/pkg/tenantcap"
	chart "github.com/harvest-run/harvest/tools/admissionchart"
)

func main() {
	out := flag.String("out", "../docs/admission-limits.svg", "where to write the SVG (run from tools/)")
	maxRuns := flag.Int("max-runs", tenantcap.DefaultMaxRuns, "max_runs of the chart")
	tenants := flag.Int("tenants", 8, "registered tenants (for the static lines)")
	flag.Parse()
	var buf bytes.Buffer
	if err := chart.WriteSVG(&buf, chart.Options{MaxRuns: *maxRuns, Tenants: *tenants}, chart.DefaultSeries()); err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
	if err := os.WriteFile(*out, buf.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
}
