package claim_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// bench/statements/run.sh times the flood's claim and outcome statements
// as the worker sends them; it runs outside the test suite (it needs psql
// and River's schema), so this keeps its Harvest half in step with the
// functions: its fill and loop, run here on a small flood, must claim and
// complete half of it.
func TestStatementsBenchLoopClaimsAndCompletesHalfTheFlood(t *testing.T) {
	t.Parallel()
	b := setup(t)
	read := func(name string) string {
		sql, err := os.ReadFile(filepath.Join("..", "..", "bench", "statements", name))
		require.NoError(t, err)
		return string(sql)
	}
	conn, err := b.db.Acquire(b.ctx)
	require.NoError(t, err)
	defer conn.Release()
	exec := func(sql string) {
		t.Helper()
		_, err := conn.Exec(b.ctx, sql)
		require.NoError(t, err, sql)
	}

	// The fill, one statement at a time (VACUUM runs in no transaction),
	// with the size psql would substitute.
	for _, stmt := range strings.Split(read("harvest_fill.sql"), ";\n") {
		if strings.TrimSpace(stmt) != "" {
			exec(strings.ReplaceAll(stmt, ":rows", "300"))
		}
	}
	// What run.sh passes in PGOPTIONS (its default commit mode), then the
	// loop's DO block.
	exec(`SET harvest_bench.batch = 40`)
	exec(`SET harvest_bench.rows = 300`)
	exec(`SET synchronous_commit = off`)
	loop := read("harvest_loop.sql")
	do := strings.Index(loop, "DO $$")
	require.Positive(t, do)
	exec(loop[do:])

	var done, completed int
	require.NoError(t, conn.QueryRow(b.ctx, `SELECT
		(SELECT count(*) FROM tasks WHERE queue = 'fleet' AND state = 'done'),
		(SELECT count(*) FROM runs WHERE tenant = 'flood' AND status = 'completed')`).Scan(&done, &completed))
	// Batches of 40 until at least 150 are done: four of them.
	require.Equal(t, 160, done)
	require.Equal(t, 160, completed)
}

// The loop sends the claim's flush wait as the worker does, written out in
// its DO block (a file cannot be included there): it must stay the
// statement of pkg/claim/sql/WalFlush.sql.
func TestStatementsBenchLoopFlushesAsTheClaimDoes(t *testing.T) {
	t.Parallel()
	norm := func(path string) string {
		sql, err := os.ReadFile(path)
		require.NoError(t, err)
		var code []string
		for _, line := range strings.Split(string(sql), "\n") {
			if !strings.HasPrefix(strings.TrimSpace(line), "--") {
				code = append(code, line)
			}
		}
		return strings.Join(strings.Fields(strings.Join(code, " ")), " ")
	}
	flush := norm(filepath.Join("sql", "WalFlush.sql"))
	require.True(t, strings.HasPrefix(flush, "SELECT "), flush)
	loop := norm(filepath.Join("..", "..", "bench", "statements", "harvest_loop.sql"))
	require.Contains(t, loop, "PERFORM "+strings.TrimPrefix(flush, "SELECT ")+";",
		"bench/statements/harvest_loop.sql's flush wait differs from pkg/claim/sql/WalFlush.sql")
}
