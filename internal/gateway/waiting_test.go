package gateway

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/pkg/worker"
)

// GET /v1/runs/{id} of a queued run says why it waits: a start into a
// paused queue that a live worker serves waits for the pause (without
// naming the operator who paused it), one into a
// queue no worker serves waits for a worker; a run that left the queue
// carries no waiting object, and listings never do.
func TestGetRunSaysWhyItWaits(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	b.runWorker(t, map[string]float64{"pq": 1}, func(context.Context, worker.Task) (worker.Result, error) {
		return worker.Result{}, nil
	})
	root := b.client(t, secretRoot)
	_, err := root.PauseQueue(b.ctx, "pq")
	require.NoError(t, err)

	c := b.client(t, secretA)
	_, err = c.Start(b.ctx, "job", "pq", nil, client.StartOptions{ID: "held"})
	require.NoError(t, err)
	status, body := b.call(t, http.MethodGet, "/v1/runs/held", secretA, nil)
	require.Equal(t, http.StatusOK, status, "%s", body)
	run := decode[api.Run](t, body)
	require.Equal(t, api.StatusQueued, run.Status)
	require.NotNil(t, run.Waiting, "%s", body)
	require.Equal(t, api.WaitQueuePaused, run.Waiting.Reason)
	require.NotNil(t, run.Waiting.PausedAt)
	// The tenant learns that an operator paused the queue, not which
	// operator's token did.
	require.Empty(t, run.Waiting.PausedBy)
	require.NotContains(t, string(body), "paused_by")
	require.NotContains(t, string(body), `"root"`)

	_, err = c.Start(b.ctx, "job", "unserved", nil, client.StartOptions{ID: "alone"})
	require.NoError(t, err)
	alone, err := c.Get(b.ctx, "alone")
	require.NoError(t, err)
	require.NotNil(t, alone.Waiting)
	require.Equal(t, api.WaitNoWorker, alone.Waiting.Reason)

	page, err := c.List(b.ctx, client.ListOptions{})
	require.NoError(t, err)
	require.NotEmpty(t, page.Runs)
	for _, r := range page.Runs {
		require.Nil(t, r.Waiting, "listings stay cheap: %s", r.ID)
	}

	// Resumed, the run completes and says no more why it waits.
	_, err = root.ResumeQueue(b.ctx, "pq")
	require.NoError(t, err)
	done, err := c.Wait(b.ctx, "held", 30*time.Second)
	require.NoError(t, err)
	require.Equal(t, api.StatusCompleted, done.Status)
	require.Nil(t, done.Waiting)
}
