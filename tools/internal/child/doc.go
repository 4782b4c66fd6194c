// Package child starts the benchmarks' and the soak's child processes so
// that they do not outlive the run: each in its own process group (a
// Ctrl-C reaches only the harness, which stops them in order and reports)
// and, on Linux, killed by the kernel if the harness dies first.
package child
