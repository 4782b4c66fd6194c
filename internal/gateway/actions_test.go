package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/pkg/worker"
)

// runWorker serves queues on the tenant A's home shard with handler until
// the test ends.
func (b *bundle) runWorker(t *testing.T, queues map[string]float64, handler worker.HandlerFunc) {
	t.Helper()
	wnc, err := nats.Connect(b.natsURL)
	require.NoError(t, err)
	t.Cleanup(wnc.Close)
	cfg := worker.DefaultConfig()
	cfg.Shard = b.gw.home(tenantOn[0])
	cfg.Queues = queues
	cfg.PollInterval = 50 * time.Millisecond
	w, err := worker.New(b.dbs[cfg.Shard], cfg, worker.Options{NATS: wnc, Logger: discardLogger()})
	require.NoError(t, err)
	w.HandleFunc("job", handler)
	ctx, stop := context.WithCancel(b.ctx)
	ended := make(chan error, 1)
	go func() { ended <- w.Run(ctx) }()
	t.Cleanup(func() { stop(); <-ended })
	<-w.Ready()
}

// A run that failed for good is retried through the API: it runs again
// and completes, its attempts counted on; only the tenant's own failed or
// cancelled runs can be retried, by a token that may start runs.
func TestRetryRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	var calls atomic.Int64
	b.runWorker(t, map[string]float64{"rq": 1}, func(_ context.Context, _ worker.Task) (worker.Result, error) {
		if calls.Add(1) == 1 {
			return worker.Result{}, errors.New("first try fails")
		}
		return worker.Result{Output: json.RawMessage(`{"ok":true}`)}, nil
	})
	c := b.client(t, secretA)
	st, err := c.Start(b.ctx, "job", "rq", nil, client.StartOptions{ID: "r1", MaxAttempts: 1})
	require.NoError(t, err)
	run, err := c.Wait(b.ctx, st.Run.ID, 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, api.StatusFailed, run.Status)

	status, body := b.call(t, http.MethodPost, "/v1/runs/r1/retry", secretB, nil)
	require.Equal(t, http.StatusNotFound, status, "another tenant's run: %s", body)
	status, _ = b.call(t, http.MethodPost, "/v1/runs/r1/retry", secretAReads, nil)
	require.Equal(t, http.StatusForbidden, status, "runs:read alone may not retry")

	retried, err := c.Retry(b.ctx, "r1")
	require.NoError(t, err)
	require.Equal(t, api.StatusQueued, retried.Status)
	require.Equal(t, 1, retried.Attempts)
	run, err = c.Wait(b.ctx, "r1", 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, api.StatusCompleted, run.Status)
	require.Equal(t, 2, run.Attempts)
	require.JSONEq(t, `{"ok":true}`, string(run.Output))

	_, err = c.Retry(b.ctx, "r1")
	var ae *client.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, http.StatusConflict, ae.API.Status)
	require.Contains(t, ae.API.Message, "completed")
	require.Equal(t, 1, b.count(t, b.gw.home(tenantOn[0]), `SELECT count(*) FROM audit WHERE action = 'run.retry' AND actor = 'a-ci'`))
}

// A paused queue is served by no worker while the same worker keeps
// taking another queue's runs; its starts are accepted and wait; the keys
// view says it is paused; resuming lets its runs through. Only an
// operator's token with weights:write pauses.
func TestPauseRoute(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.runWorker(t, map[string]float64{"pq": 1, "other": 1}, func(context.Context, worker.Task) (worker.Result, error) {
		return worker.Result{}, nil
	})
	for _, secret := range []string{secretA, secretWRead, secretAOps} {
		status, body := b.call(t, http.MethodPost, "/v1/queues/pq/pause", secret, nil)
		require.Equal(t, http.StatusForbidden, status, "%s", body)
	}
	root := b.client(t, secretRoot)
	res, err := root.PauseQueue(b.ctx, "pq")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.Status())
	require.Len(t, res.Shards, 2)
	for _, s := range res.Shards {
		require.NotNil(t, s.Paused)
		require.Equal(t, "root", s.Paused.By)
	}
	keys, err := root.Keys(b.ctx, "pq", 0)
	require.NoError(t, err)
	require.Equal(t, []int{0, 1}, keys.PausedShards)

	c := b.client(t, secretA)
	_, err = c.Start(b.ctx, "job", "pq", nil, client.StartOptions{ID: "held"})
	require.NoError(t, err, "starts are accepted while paused")
	// The worker keeps claiming: runs of the other queue complete, one
	// after the other, while the paused one waits.
	for _, id := range []string{"o1", "o2", "o3"} {
		_, err = c.Start(b.ctx, "job", "other", nil, client.StartOptions{ID: id})
		require.NoError(t, err)
		run, err := c.Wait(b.ctx, id, 30*time.Second)
		require.NoError(t, err)
		require.Equal(t, api.StatusCompleted, run.Status)
	}
	held, err := c.Get(b.ctx, "held")
	require.NoError(t, err)
	require.Equal(t, api.StatusQueued, held.Status)

	res, err = root.ResumeQueue(b.ctx, "pq")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, res.Status())
	run, err := c.Wait(b.ctx, "held", 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, api.StatusCompleted, run.Status)
	keys, err = root.Keys(b.ctx, "pq", 0)
	require.NoError(t, err)
	require.Empty(t, keys.PausedShards)
}
