// Package cli implements the harvest command: one file per command, a small
// table of commands, and exit codes scripts can rely on.
package cli
