// Package tools is the module of the project's own tools, kept out of the
// product's module so that their dependencies (plotting) are not the
// product's: the admission chart of docs/admission.md (admissionchart,
// cmd/admission-chart).
package tools
