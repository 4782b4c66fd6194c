package tenantcap

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/shard"
)

type auditRow struct {
	Actor, Outcome, Message string
	Old, New                []byte
}

func auditRows(t *testing.T, db shard.Querier) []auditRow {
	t.Helper()
	rows, err := db.Query(context.Background(),
		`SELECT actor, outcome, message, old_value, new_value FROM audit WHERE action = $1 ORDER BY id`, AuditAction)
	require.NoError(t, err)
	defer rows.Close()
	var out []auditRow
	for rows.Next() {
		var r auditRow
		require.NoError(t, rows.Scan(&r.Actor, &r.Outcome, &r.Message, &r.Old, &r.New))
		out = append(out, r)
	}
	require.NoError(t, rows.Err())
	return out
}

func TestConfigPersistsAndIsAudited(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testsvc.NewDB(t)

	cur, err := LoadConfig(ctx, db)
	require.NoError(t, err)
	require.Equal(t, DefaultConfig(), cur.Config)
	require.True(t, cur.UpdatedAt.IsZero())

	cur, err = SetConfig(ctx, db, "admin:alice", Config{Algorithm: api.AlgorithmDynamic, TFM: 3})
	require.NoError(t, err)
	require.Equal(t, "admin:alice", cur.UpdatedBy)
	require.False(t, cur.UpdatedAt.IsZero())

	// Only the TFM: the algorithm stays.
	cur, err = ApplyPut(ctx, db, "admin:bob", []byte(`{"tfm": 2.5}`), 0)
	require.NoError(t, err)
	require.Equal(t, Config{Algorithm: api.AlgorithmDynamic, TFM: 2.5}, cur.Config)

	// Refusals change nothing and are audited.
	_, err = ApplyPut(ctx, db, "admin:bob", []byte(`{"max_runs": 500}`), 0)
	var ae *api.Error
	require.True(t, errors.As(err, &ae))
	require.Equal(t, http.StatusBadRequest, ae.Status)
	require.Equal(t, "max_runs", ae.Field)
	require.Contains(t, ae.Message, "read-only")
	_, err = UpdateConfig(ctx, db, "cli:carol", Patch{TFM: new(-1.0)})
	require.True(t, errors.As(err, &ae))
	require.Equal(t, "tfm", ae.Field)
	// Another actor: bob's second 400 within the minute would fold into
	// his first refused row (weights.AuditRefused).
	_, err = ApplyPut(ctx, db, "admin:dave", []byte("\x00not json"), 0)
	require.True(t, errors.As(err, &ae))

	// A restarted gateway loads what was persisted.
	again, err := LoadConfig(ctx, db)
	require.NoError(t, err)
	require.Equal(t, cur.Config, again.Config)
	require.Equal(t, "admin:bob", again.UpdatedBy)
	require.WithinDuration(t, cur.UpdatedAt, again.UpdatedAt, time.Microsecond)

	rows := auditRows(t, db)
	require.Len(t, rows, 5)
	require.Equal(t, OutcomeOK, rows[0].Outcome)
	require.Equal(t, "admin:alice", rows[0].Actor)
	require.JSONEq(t, `{"algorithm":"no_limit","tfm":1}`, string(rows[0].Old))
	require.JSONEq(t, `{"algorithm":"dynamic","tfm":3}`, string(rows[0].New))
	require.JSONEq(t, `{"algorithm":"dynamic","tfm":3}`, string(rows[1].Old))
	require.JSONEq(t, `{"algorithm":"dynamic","tfm":2.5}`, string(rows[1].New))
	require.Equal(t, OutcomeRefused, rows[2].Outcome)
	require.JSONEq(t, `{"max_runs":500}`, string(rows[2].New))
	require.Contains(t, rows[2].Message, "max_runs")
	require.JSONEq(t, `{"algorithm":"dynamic","tfm":2.5}`, string(rows[2].Old))
	require.Equal(t, OutcomeRefused, rows[3].Outcome)
	require.Equal(t, "cli:carol", rows[3].Actor)
	require.JSONEq(t, `{"tfm":-1}`, string(rows[3].New))
	require.Contains(t, rows[3].Message, "tfm")
	require.Equal(t, OutcomeRefused, rows[4].Outcome)
	require.JSONEq(t, `{"body":"not json"}`, string(rows[4].New))
}

func TestWatcherSeesChangeOverNATS(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testsvc.NewDB(t)
	url := testsvc.NATSURL(t)
	prefix := testsvc.RandomName("h")
	conns := make([]*nats.Conn, 2)
	for i := range conns {
		nc, err := nats.Connect(url)
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		conns[i] = nc
	}
	_, err := SetConfig(ctx, db, "admin:alice", Config{Algorithm: api.AlgorithmStatic, TFM: 2})
	require.NoError(t, err)

	// Both gateways start with the persisted value; the periodic reload is
	// far off, so only the announcement can bring the next change.
	watchers := make([]*Watcher, 2)
	for i := range watchers {
		w := NewWatcher(WatcherOptions{Shard0: db, NATS: conns[i], Prefix: prefix, Reload: time.Hour})
		require.NoError(t, w.Start(ctx))
		t.Cleanup(w.Stop)
		require.Equal(t, Config{Algorithm: api.AlgorithmStatic, TFM: 2}, w.Config())
		watchers[i] = w
	}

	cur, err := ApplyPut(ctx, db, "admin:alice", []byte(`{"algorithm":"dynamic","tfm":3}`), 0)
	require.NoError(t, err)
	require.True(t, watchers[0].Apply(cur), "the writing gateway applies at once")
	require.NoError(t, PublishChange(ctx, conns[0], prefix, cur))
	require.NoError(t, conns[0].Flush())

	require.Eventually(t, func() bool { return watchers[1].Config() == cur.Config },
		5*time.Second, 10*time.Millisecond, "the second gateway never saw the change")
	require.Equal(t, "admin:alice", watchers[1].Current().UpdatedBy)

	// An older value (a slow reload) never undoes a newer one.
	require.False(t, watchers[1].Apply(Current{Config: DefaultConfig(), UpdatedAt: cur.UpdatedAt.Add(-time.Second)}))
	require.Equal(t, cur.Config, watchers[1].Config())
}

func TestWatcherFallsBackToPeriodicReload(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testsvc.NewDB(t)
	changes := make(chan Current, 4)
	w := NewWatcher(WatcherOptions{Shard0: db, Reload: 20 * time.Millisecond, OnChange: func(c Current) { changes <- c }})
	require.NoError(t, w.Start(ctx))
	defer w.Stop()
	require.Equal(t, DefaultConfig(), w.Config())

	// Nobody announces this change: the reload alone must bring it.
	cur, err := SetConfig(ctx, db, "cli:root", Config{Algorithm: api.AlgorithmStatic, TFM: 0.5})
	require.NoError(t, err)
	select {
	case got := <-changes:
		require.Equal(t, cur.Config, got.Config)
	case <-time.After(5 * time.Second):
		t.Fatal("the periodic reload never applied the change")
	}

	// The announcement body is a hint only and is never trusted as is.
	var body Current
	require.NoError(t, json.Unmarshal([]byte(`{"algorithm":"static","tfm":0.5,"updated_by":"cli:root"}`), &body))
	require.Equal(t, cur.Config, body.Config)
}

func TestWatcherStartFailsWithoutShard0(t *testing.T) {
	t.Parallel()
	w := NewWatcher(WatcherOptions{})
	require.Error(t, w.Start(context.Background()))
}
