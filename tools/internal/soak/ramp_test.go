package soak

import (
	"encoding/binary"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/envdoc"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/workerbin"
)

// A ramp step holds only when its p95 claim wait is within the bound, the
// load got 90% of its rate acknowledged, no start was given up and no
// promise broke; each failure is named.
func TestRampStepJudge(t *testing.T) {
	t.Parallel()
	bound := 5 * time.Second
	ok := rampStep{rate: 100, acked: 160, wait: [3]time.Duration{time.Second, 4 * time.Second, 9 * time.Second}}
	require.Empty(t, ok.judge(bound), "the p99 is not judged, and the pair's bursts may put acked over the rate")

	slow := ok
	slow.wait[1] = 5100 * time.Millisecond
	require.Equal(t, "p95 claim wait 5.1s over the bound of 5s", slow.judge(bound))

	short := ok
	short.acked = 89
	require.Equal(t, "the load sent 89 of its 100 starts/s", short.judge(bound))

	all := slow
	all.acked, all.giveups, all.violations = 10, 3, 2
	require.Equal(t, "2 promise(s) broken; p95 claim wait 5.1s over the bound of 5s; the load sent 10 of its 100 starts/s; 3 starts given up",
		all.judge(bound))
}

// The mix's table divides the database's work of a step by the starts
// acknowledged in it, says n/a for the CPU of a server it cannot see, and
// the verdict names the last step held before the first that failed.
func TestMixTableAndVerdict(t *testing.T) {
	t.Parallel()
	db := dbDelta{el: 10 * time.Second, local: true, backendCPU: 3 * time.Second, serverCPU: 5 * time.Second,
		wal: 2000 * 1024, commits: 12000, others: 50, statements: 40000}
	held := mixStep{rampStep: rampStep{rate: 100, acked: 100, wait: [3]time.Duration{10 * time.Millisecond, time.Second, 2 * time.Second}},
		offered: 166, claimsAll: 170, runs: 1000, behind: 7, db: db}
	remote := held
	remote.rate, remote.db.local, remote.db.checkpoints = 200, false, 1
	failed := held
	failed.rate, failed.runs, failed.failed = 300, 0, "p95 claim wait 8.1s over the bound of 5s"

	table := mixTable([]mixStep{held, remote, failed})
	lines := strings.Split(strings.TrimSpace(table), "\n")
	require.Len(t, lines, 5)
	require.Equal(t, "| 100 | 166 | 100 | 170 | 10ms / 1s / 2s | 0 | 7 | 3.00 / 5.00 | 2.0 | 12.0 | 40.0 | 5 | held |", lines[2])
	require.Contains(t, lines[3], "| n/a | 2.0 (checkpoint) | 12.0 | 40.0 | 5 | held |")
	require.Contains(t, lines[4], "| - | - | - | - | - | failed: p95 claim wait 8.1s over the bound of 5s |")

	require.Equal(t, "highest rate held: 200 starts/s (failed at 300: p95 claim wait 8.1s over the bound of 5s)",
		mixVerdict([]mixStep{held, remote, failed}, false))
	require.Equal(t, "highest rate held: none (the first step, 300 starts/s, failed)", mixVerdict([]mixStep{failed}, false))
	require.Equal(t, "highest rate held: 200 starts/s (every step held: --minutes ended the ramp before it broke)",
		mixVerdict([]mixStep{held, remote}, false))
	require.Equal(t, "highest rate held: 200 starts/s (interrupted before a step failed)", mixVerdict([]mixStep{held, remote}, true))

	_, _, _, stmts, _ := perRun(dbDelta{statements: 10, uncounted: 2}, 5)
	require.Equal(t, "2.0 (2 connections uncounted)", stmts)
}

// pgMessage frames a typed frontend message.
func pgMessage(typ byte, body string) []byte {
	b := []byte{typ, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(4+len(body)))
	return append(b, body...)
}

// pgUntyped frames an untyped opening message (length, code, rest).
func pgUntyped(code uint32, rest string) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint32(b, uint32(8+len(rest)))
	binary.BigEndian.PutUint32(b[4:], code)
	return append(b, rest...)
}

// The proxy counts a connection's Execute and simple Query messages
// however the stream is cut into reads, after an SSLRequest the server
// refused; a TLS stream after an accepted one is reported as uncounted.
func TestStatementCounter(t *testing.T) {
	t.Parallel()
	var stream []byte
	stream = append(stream, pgUntyped(pgSSLRequest, "")...)
	stream = append(stream, pgUntyped(pgProtocol3, "user\x00postgres\x00database\x00q\x00\x00")...)
	stream = append(stream, pgMessage('p', "secret\x00")...)
	// A pgx statement the first time: Parse and Describe, then Bind,
	// Execute, Sync; then a batch of two Executes; then a simple Query
	// whose text holds the letters E and Q.
	stream = append(stream, pgMessage('P', "s1\x00SELECT 1\x00\x00\x00")...)
	stream = append(stream, pgMessage('D', "Ss1\x00")...)
	stream = append(stream, pgMessage('S', "")...)
	for range 3 {
		stream = append(stream, pgMessage('B', "\x00s1\x00\x00\x00\x00\x00\x00\x00")...)
		stream = append(stream, pgMessage('E', "\x00\x00\x00\x00\x00")...)
	}
	stream = append(stream, pgMessage('S', "")...)
	stream = append(stream, pgMessage('Q', "SELECT 'EQ'\x00")...)
	stream = append(stream, pgMessage('X', "")...)

	for _, chunk := range []int{len(stream), 1, 3, 7} {
		var n, u atomic.Int64
		c := &statementCounter{statements: &n, uncounted: &u, startup: true}
		for b := stream; len(b) > 0; {
			k := min(chunk, len(b))
			c.feed(b[:k])
			b = b[k:]
		}
		require.Equal(t, int64(4), n.Load(), "reads of %d bytes", chunk)
		require.Zero(t, u.Load())
	}

	var n, u atomic.Int64
	c := &statementCounter{statements: &n, uncounted: &u, startup: true}
	c.feed(pgUntyped(pgSSLRequest, ""))
	c.feed([]byte{0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 'E', 'Q'})
	c.feed(pgMessage('Q', "SELECT 1\x00"))
	require.Zero(t, n.Load())
	require.Equal(t, int64(1), u.Load())
}

// The proxy tells the statements' kinds from their SQL: an Execute is of
// the kind of the statement its Bind named, whatever the reads cut, and a
// simple Query of its own text.
func TestStatementCounterKinds(t *testing.T) {
	t.Parallel()
	var stream []byte
	stream = append(stream, pgUntyped(pgProtocol3, "user\x00postgres\x00\x00")...)
	stream = append(stream, pgMessage('P', "c\x00SELECT * FROM harvest_claim_batch($1)\x00\x00\x00")...)
	stream = append(stream, pgMessage('P', "o\x00SELECT * FROM harvest_outcome_batch($1)\x00\x00\x00")...)
	stream = append(stream, pgMessage('P', "\x00SELECT pg_logical_emit_message(true, 'x', '')\x00\x00\x00")...)
	bind := func(name string) {
		// A long parameter after the names: only the names are read.
		stream = append(stream, pgMessage('B', "\x00"+name+"\x00"+strings.Repeat("x", 40000))...)
		stream = append(stream, pgMessage('E', "\x00\x00\x00\x00\x00")...)
	}
	bind("c")
	bind("o")
	bind("o")
	bind("")
	bind("unknown")
	stream = append(stream, pgMessage('Q', "BEGIN\x00")...)
	stream = append(stream, pgMessage('Q', "SELECT harvest_start_group()\x00")...)
	stream = append(stream, pgMessage('Q', "commit;\x00")...)

	for _, chunk := range []int{len(stream), 1, 5, 4096} {
		var n, u atomic.Int64
		var kinds [numKinds]atomic.Int64
		c := &statementCounter{statements: &n, uncounted: &u, kinds: &kinds, startup: true}
		for b := stream; len(b) > 0; {
			k := min(chunk, len(b))
			c.feed(b[:k])
			b = b[k:]
		}
		require.Equal(t, int64(8), n.Load(), "reads of %d bytes", chunk)
		got := map[stmtKind]int64{}
		for k := range kinds {
			if v := kinds[k].Load(); v > 0 {
				got[stmtKind(k)] = v
			}
		}
		require.Equal(t, map[stmtKind]int64{kindClaim: 1, kindOutcome: 2, kindWALFlush: 1, kindOther: 1, kindTx: 2, kindStart: 1},
			got, "reads of %d bytes", chunk)
	}
}

// The second table of the mix splits the shard backends' CPU per run by
// the binaries' application names and counts the statements by kind.
func TestWorkTable(t *testing.T) {
	t.Parallel()
	db := dbDelta{el: 10 * time.Second, local: true, backendCPU: 3 * time.Second,
		byApp: map[string]time.Duration{"harvest-gateway": time.Second, "harvest-worker": 1500 * time.Millisecond}}
	db.kinds[kindClaim], db.kinds[kindOutcome], db.kinds[kindStart], db.kinds[kindHeartbeat] = 100, 250, 125, 10
	step := mixStep{rampStep: rampStep{rate: 100}, claimsAll: 150, runs: 1000, db: db}
	none := step
	none.rate, none.runs = 200, 0
	lines := strings.Split(strings.TrimSpace(workTable([]mixStep{step, none})), "\n")
	require.Len(t, lines, 4)
	require.Equal(t, "| 100 | 1.00 / 1.50 / 0.50 | 10.0 (15.0) | 25.0 | 12.5 (8.0) | 1.0 |", lines[2])
	require.Equal(t, "| 200 | - | - | - | - | - |", lines[3])
}

// Every variable the fleet sets is one the gateway or the worker reads (a
// misspelt one would be ignored, and the process would run on a default
// the report does not show), and a fleet on the shipped defaults sets
// none of the fault tuning.
func TestFleetSetsOnlyRealVariables(t *testing.T) {
	t.Parallel()
	vars, err := envdoc.Vars("HARVEST", &workerbin.Config{}, &gateway.Config{})
	require.NoError(t, err)
	known := envdoc.Names(vars)
	o := Options{Slots: 100}
	o.defaults()
	f := &Fleet{opts: o, gwAddrs: []string{"127.0.0.1:1"}, tokensFile: "/tokens.json"}
	wt, gt := f.Tuning()
	require.NotEmpty(t, wt)
	require.NotEmpty(t, gt)
	for _, list := range [][]Setting{f.workerRequired(0, "w0-0"), f.gatewayRequired(0), wt, gt} {
		for _, s := range list {
			require.True(t, known[s.Var], "%s is not a variable of the gateway or the worker", s.Var)
			require.NotEmpty(t, s.Why, s.Var)
		}
	}
	require.Contains(t, envOf(wt), "HARVEST_WORKER_MAX_CONCURRENT_CLAIMS=100")

	f.opts.Shipped = true
	wt, gt = f.Tuning()
	require.Empty(t, wt)
	require.Empty(t, gt)
	def := shippedDefaults()
	require.Equal(t, "30s", def["HARVEST_WORKER_LEASE"], "the defaults are read from the worker's configuration")
}
