// Package worker_test runs the real worker binary as a process against a
// real shard and NATS: crashes (SIGKILL), pauses past the lease (SIGSTOP),
// graceful stops (SIGTERM) and the command line.
package worker_test
