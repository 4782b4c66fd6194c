// Package tools is the module of the project's own tools, kept out of the
// product's module so that their dependencies are not the product's: the
// admission chart of docs/admission.md (admissionchart,
// cmd/admission-chart, with plotting), the benchmarks, the soak and the
// fault suite, and the tests that need a heavy module (test/admin with
// chromedp, test/compose with compose-go, test/boundary with
// golang.org/x/tools). `go -C tools test ./...` runs them all.
package tools
