// Package fuzz holds the fuzz targets of the gateway's inputs: start bodies
// over HTTP and NATS, batch bodies, weight, quota and admission bodies (with
// fuzzed path values), and the validators behind them. Each drives an
// in-process gateway (gateway.New and its handler) against a real database,
// and requires that every input gets either a success or a 4xx with a JSON
// error that names a message, never a 5xx or a panic.
//
// Seeds live under testdata/fuzz/<FuzzName>/ and run with every `go test`;
// CI fuzzes each target for a few seconds (.ci/run), and longer runs are
// done by hand:
//
//	go test -run '^$' -fuzz '^FuzzHTTPStart$' -fuzztime 10m ./test/fuzz/
package fuzz
