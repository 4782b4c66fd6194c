// Package boundary holds the tests of the public API's boundary: what the
// packages under pkg/ export names nothing from internal/, so a module
// outside this one can call and fill in everything they export; the
// product's binaries link no harness; and the product's go.mod requires
// no module that only these tests need. It lives in the tools module
// because its loader (golang.org/x/tools/go/packages) is such a module,
// and runs its checks in the main module's directory.
package boundary
