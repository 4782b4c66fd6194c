package weights_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testfactory"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
	"github.com/harvest-run/harvest/pkg/weights"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

// deadURL points at a port where nothing listens: a shard that is down.
const deadURL = "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=1"

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func deadPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), deadURL)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

func shardsOf(dbs ...shard.Querier) []weights.Shard {
	out := make([]weights.Shard, len(dbs))
	for i, db := range dbs {
		out[i] = weights.Shard{Index: i, DB: db}
	}
	return out
}

func outcomes(r []api.ShardOutcome) []string {
	out := make([]string, len(r))
	for i, s := range r {
		out[i] = s.Outcome
	}
	return out
}

// overrides returns queue's overrides on db as key -> weight.
func overrides(t *testing.T, db shard.Querier, queue string) map[string]float64 {
	t.Helper()
	list, err := weights.List(context.Background(), db, queue)
	require.NoError(t, err)
	m := map[string]float64{}
	for _, o := range list {
		m[o.Key] = o.Weight
	}
	return m
}

// fill gives queue n overrides k0000.. on db with one statement (the count
// trigger keeps the cap's counter exact).
func fill(t *testing.T, db *pgxpool.Pool, queue string, n int) {
	t.Helper()
	_, err := db.Exec(context.Background(), `
		INSERT INTO weight_overrides (queue, key, weight)
		SELECT $1, 'k' || lpad(i::text, 4, '0'), 2 FROM generate_series(1, $2) i`, queue, n)
	require.NoError(t, err)
}

type auditRow struct {
	Actor, Action, Queue, Key, Outcome, Message string
	Old, New                                    map[string]any
}

func auditRows(t *testing.T, db shard.Querier) []auditRow {
	t.Helper()
	page, err := weights.AuditList(context.Background(), db, "", weights.MaxAuditLimit)
	require.NoError(t, err)
	out := make([]auditRow, 0, len(page.Entries))
	for i := len(page.Entries) - 1; i >= 0; i-- { // oldest first
		e := page.Entries[i]
		r := auditRow{Actor: e.Actor, Action: e.Action, Outcome: e.Outcome, Message: e.Message}
		if e.Queue != nil {
			r.Queue = *e.Queue
		}
		if e.Key != nil {
			r.Key = *e.Key
		}
		require.NoError(t, json.Unmarshal(e.OldValue, &r.Old))
		require.NoError(t, json.Unmarshal(e.NewValue, &r.New))
		out = append(out, r)
	}
	return out
}

// flood makes n pending tasks of queue under key, due at due, and returns
// their ids in order.
func flood(t *testing.T, db *pgxpool.Pool, queue, key, quotaKey string, n int, due time.Time) []int64 {
	t.Helper()
	ctx := context.Background()
	ids := make([]int64, n)
	for i := range ids {
		_, ids[i] = testfactory.Task(ctx, t, db, testfactory.TaskOpts{Queue: queue, Key: key, QuotaKey: quotaKey,
			DueAt: due, Now: due, Run: testfactory.RunOpts{Uncounted: true}})
	}
	return ids
}

func ptr[T any](v T) *T { return &v }

func poolFor(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}
