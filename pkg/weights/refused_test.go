package weights_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/auditdoc"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/weights"
)

// AuditRefused folds every refusal by actor, action and status, whatever
// the caller varies (queue, key, message, body) and whatever window it
// asks for (zero is the default window, not "unfolded"); what it stores is
// bounded and storable, so text no column can hold (NUL, invalid UTF-8)
// is recorded rather than failing the insert.
func TestAuditRefusedFoldsAndBounds(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	db := testsvc.NewDB(t)
	huge := strings.Repeat("z", 100<<10)
	for i, ref := range []weights.RefusedChange{
		{Actor: "mallory", Action: "run.retry", Status: 400, Message: "a: " + huge, Queue: "q\x00" + huge, Key: "\xff" + huge,
			Attempted: []byte(huge)},
		{Actor: "mallory", Action: "run.retry", Status: 400, Message: "b", Queue: "other"},
		{Actor: "mallory", Action: "run.retry", Status: 400, Message: "c", Key: "k"},
	} {
		require.NoError(t, weights.AuditRefused(ctx, db, ref, 0), "refusal %d", i)
	}
	require.NoError(t, weights.AuditRefused(ctx, db, weights.RefusedChange{Actor: "mallory", Action: "run.retry", Status: 429, Message: "over"}, 0))
	require.NoError(t, weights.AuditRefused(ctx, db, weights.RefusedChange{Actor: "mallory", Action: "weight.set", Status: 400, Message: "bad"}, 0))
	require.NoError(t, weights.AuditRefused(ctx, db, weights.RefusedChange{Actor: "alice", Action: "run.retry", Status: 400, Message: "a"}, 0))

	type row struct {
		actor, action       string
		status, repeats     int
		queue, key, message string
		newBytes            int
		lastAt              bool
	}
	rows, err := db.Query(context.Background(), `SELECT actor, action, status, repeats, coalesce(queue, ''), coalesce(key, ''), message,
		coalesce(octet_length(new_value->>'body'), -1), last_at IS NOT NULL FROM audit WHERE outcome = 'refused' ORDER BY id`)
	require.NoError(t, err)
	var got []row
	for rows.Next() {
		var r row
		require.NoError(t, rows.Scan(&r.actor, &r.action, &r.status, &r.repeats, &r.queue, &r.key, &r.message, &r.newBytes, &r.lastAt))
		got = append(got, r)
	}
	require.NoError(t, rows.Err())
	require.Len(t, got, 4, "one row per actor, action and status")
	first := got[0]
	require.Equal(t, []any{"mallory", "run.retry", 400, 2, true}, []any{first.actor, first.action, first.status, first.repeats, first.lastAt})
	for _, s := range []string{first.queue, first.key, first.message} {
		require.LessOrEqual(t, len(s), auditdoc.MaxTextBytes)
		require.True(t, strings.HasSuffix(s, auditdoc.Marker))
	}
	require.True(t, strings.HasPrefix(first.queue, "q"+strings.Repeat("z", 10)), "NUL dropped: %.20q", first.queue)
	require.True(t, strings.HasPrefix(first.key, "\uFFFD"), "invalid UTF-8 replaced: %.20q", first.key)
	require.True(t, strings.HasPrefix(first.message, "a: "), "the row keeps its window's first refusal")
	require.Positive(t, first.newBytes, "a body too long to keep is kept as text, cut")
	require.LessOrEqual(t, first.newBytes, auditdoc.MaxBytes)
	for i, want := range [][3]any{{"mallory", "run.retry", 429}, {"mallory", "weight.set", 400}, {"alice", "run.retry", 400}} {
		r := got[i+1]
		require.Equal(t, want, [3]any{r.actor, r.action, r.status})
		require.Zero(t, r.repeats)
		require.False(t, r.lastAt)
	}
}
