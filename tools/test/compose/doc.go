// Package compose checks deploy/compose.yaml against the binaries it runs
// and runs the fleet it describes. No Docker engine is needed: the file is
// loaded with compose-go, and its Harvest services run as local processes
// against the test's Postgres, three embedded NATS servers routed into one
// cluster, each loading deploy/nats/nats.conf, and an in-test OTLP
// receiver standing in for Jaeger. It is in the tools module so that the
// product's go.mod does not carry compose-go.
package compose
