package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/auditdoc"
)

// refusedRow is what a test reads of a refused audit row, with the sizes
// of what it stores.
type refusedRow struct {
	Status, Repeats int
	Message         string
	// The sizes of what the row stores: of the attempted body, its text
	// when it was kept as {"body": text}, else the document's.
	QueueBytes, KeyBytes, MessageBytes, New int
	LastAt                                  bool
}

// refusedRows reads the refused rows of actor and action on shard 0.
func (b *bundle) refusedRows(t *testing.T, actor, action string) []refusedRow {
	t.Helper()
	rows, err := b.dbs[0].Query(b.ctx, `SELECT status, repeats, message,
			coalesce(octet_length(queue), 0), coalesce(octet_length(key), 0), octet_length(message),
			coalesce(octet_length(new_value->>'body'), octet_length(new_value::text), 0), last_at IS NOT NULL
		FROM audit WHERE actor = $1 AND action = $2 AND outcome = 'refused' ORDER BY id`, actor, action)
	require.NoError(t, err)
	defer rows.Close()
	var out []refusedRow
	for rows.Next() {
		var r refusedRow
		require.NoError(t, rows.Scan(&r.Status, &r.Repeats, &r.Message, &r.QueueBytes, &r.KeyBytes, &r.MessageBytes, &r.New, &r.LastAt))
		out = append(out, r)
	}
	require.NoError(t, rows.Err())
	return out
}

// requireFolded checks that the rows hold n refusals in few rows (one per
// fold window: the flood takes well under one, two allow for a test that
// straddles a window's end), each row within the byte caps.
func requireFolded(t *testing.T, rows []refusedRow, n, status int) {
	t.Helper()
	require.NotEmpty(t, rows)
	require.LessOrEqual(t, len(rows), 2, "%d refusals left %d rows", n, len(rows))
	total := 0
	for _, r := range rows {
		total += 1 + r.Repeats
		require.Equal(t, status, r.Status)
		require.LessOrEqual(t, r.MessageBytes, auditdoc.MaxTextBytes)
		require.LessOrEqual(t, r.QueueBytes, auditdoc.MaxTextBytes)
		require.LessOrEqual(t, r.KeyBytes, auditdoc.MaxTextBytes)
		require.LessOrEqual(t, r.New, auditdoc.MaxBytes)
	}
	require.Equal(t, n, total, "every refusal is counted")
	require.True(t, rows[0].LastAt, "a folded row says when its last refusal came")
}

// A flood of distinct bad requests on the retry route (each with its own
// huge unknown query parameter, which the 400 names) by one token leaves
// one small row with a count, not one row per request of twice the
// parameter's size; another token's refusals get their own row; and GET
// /v1/audit shows the count.
func TestRetryRefusalFloodFolds(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const n = 40
	for i := range n {
		// Each name is distinct at its start, so no prefix of the message
		// is shared, and far longer than a row may keep.
		param := fmt.Sprintf("p%03d%s", i, strings.Repeat("x", 30<<10))
		status, out := b.call(t, http.MethodPost, "/v1/runs/r1/retry?"+param+"=1", secretA, nil)
		require.Equal(t, http.StatusBadRequest, status, "%.200s", out)
		require.Less(t, len(out), 40<<10, "the answer names the parameter once in full, in its field")
	}
	for range 3 {
		status, _ := b.call(t, http.MethodPost, "/v1/runs/r1/retry?other=1", secretB, nil)
		require.Equal(t, http.StatusBadRequest, status)
	}
	a := b.refusedRows(t, "a-ci", "run.retry")
	requireFolded(t, a, n, http.StatusBadRequest)
	require.Contains(t, a[0].Message, "p000", "the row keeps its window's first refusal")
	require.Contains(t, a[0].Message, auditdoc.Marker)
	requireFolded(t, b.refusedRows(t, "b-ci", "run.retry"), 3, http.StatusBadRequest)

	status, out := b.call(t, http.MethodGet, "/v1/audit", secretRoot, nil)
	require.Equal(t, http.StatusOK, status, string(out))
	page := decode[AuditPage](t, out)
	repeats := map[string]int{}
	for _, e := range page.Entries {
		require.Equal(t, "refused", e.Outcome)
		repeats[e.Actor] += 1 + e.Repeats
		require.NotNil(t, e.LastAt, "a folded row says when its latest refusal came")
		require.False(t, e.LastAt.Before(e.At.Time))
	}
	require.Equal(t, map[string]int{"a-ci": n, "b-ci": 3}, repeats)
}

// A flood of retries that admission refuses (429) folds too, into a row of
// its own beside the same token's 400s: the status is part of what makes
// two refusals the same.
func TestRetryOverLimitFloodFolds(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{MaxRuns: 1})
	b.startRun(t, secretA, http.StatusCreated, `{"id":"c1","name":"echo","queue":"shared"}`)
	status, out := b.call(t, http.MethodPost, "/v1/runs/c1/cancel", secretA, nil)
	require.Equal(t, http.StatusOK, status, string(out))
	b.startRun(t, secretA, http.StatusCreated, `{"id":"h1","name":"echo","queue":"shared"}`)
	const n = 30
	for range n {
		status, out := b.call(t, http.MethodPost, "/v1/runs/c1/retry", secretA, nil)
		require.Equal(t, http.StatusTooManyRequests, status, string(out))
	}
	status, _ = b.call(t, http.MethodPost, "/v1/runs/c1/retry?x=1", secretA, nil)
	require.Equal(t, http.StatusBadRequest, status)

	var over, bad []refusedRow
	for _, r := range b.refusedRows(t, "a-ci", "run.retry") {
		if r.Status == http.StatusTooManyRequests {
			over = append(over, r)
		} else {
			bad = append(bad, r)
		}
	}
	requireFolded(t, over, n, http.StatusTooManyRequests)
	require.Len(t, bad, 1, "the 400 is another refusal")
	require.Equal(t, http.StatusBadRequest, bad[0].Status)
}

// Every writer of refused rows folds, whoever the caller: a privileged
// token's bad values at one action share a row however they differ (the
// body and key are the caller's to vary), and so do a tenant session's
// refused console actions; the admission route's refusals fold by status.
func TestEveryRefusalWriterFolds(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const n = 12
	for i := range n {
		body := fmt.Sprintf(`{"weight": -%d, "pad": %q}`, i+1, strings.Repeat("y", 8<<10))
		status, out := b.call(t, http.MethodPut, fmt.Sprintf("/v1/queues/q%d/weights/k%d", i, i), secretRoot, body)
		require.Equal(t, http.StatusBadRequest, status, string(out))
		status, out = b.call(t, http.MethodPut, "/v1/admission", secretRoot, fmt.Sprintf(`{"tfm": -%d}`, i+1))
		require.Equal(t, http.StatusBadRequest, status, string(out))
	}
	requireFolded(t, b.refusedRows(t, "root", "weight.set"), n, http.StatusBadRequest)
	requireFolded(t, b.refusedRows(t, "root", "admission.set"), n, http.StatusBadRequest)
	rows := b.refusedRows(t, "root", "weight.set")
	var attempted map[string]any
	require.NoError(t, b.dbs[0].QueryRow(b.ctx, `SELECT new_value FROM audit WHERE actor = 'root' AND action = 'weight.set'`).Scan(&attempted))
	require.Contains(t, attempted["body"], auditdoc.Marker, "a body longer than a row keeps is cut, and says so")
	require.Contains(t, rows[0].Message, "weight")
	raw, err := json.Marshal(attempted)
	require.NoError(t, err)
	require.LessOrEqual(t, len(raw), auditdoc.MaxBytes+64)
}
