// Package compose checks deploy/compose.yaml against the binaries it runs.
// No Docker engine is needed: the file is read and checked, not run.
package compose
