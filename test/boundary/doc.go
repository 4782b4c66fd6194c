// Package boundary holds the tests of the public API's boundary: what the
// packages under pkg/ export names nothing from internal/, so a module
// outside this one can call and fill in everything they export.
package boundary
