package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/client"
)

func TestCancelQueuedRun(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	c := b.client(t, secretA)
	// The run cancelled is the key's first, so the head a fair claim would
	// read first is the cancelled task.
	st, err := c.Start(b.ctx, "echo", "shared", nil, clientOpts("gone", "k"))
	require.NoError(t, err)
	keep, err := c.Start(b.ctx, "echo", "shared", nil, clientOpts("keep", "k"))
	require.NoError(t, err)
	require.Equal(t, 2, b.count(t, 0, `SELECT count(*) FROM tasks WHERE fairness_key = 'k' AND state = 'pending'`))

	run, err := c.Cancel(b.ctx, st.Run.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusCancelled, run.Status)
	require.NotNil(t, run.FinishedAt)
	require.Equal(t, "cancelled by a-ci", *run.Error)
	require.Equal(t, 0, b.count(t, 0, `SELECT count(*) FROM tasks t JOIN runs r ON r.pk = t.run_pk WHERE r.id = 'gone' AND t.state <> 'done'`))
	require.Equal(t, 1, b.count(t, 0, `SELECT running FROM tenant_running`), "the count dropped with the cancel")
	// A claim never sees the cancelled task: the fair claim finds the
	// key's head gone and takes the run that stays.
	res, err := claim.Claim(b.ctx, b.dbs[0], claim.Request{Queue: "shared", Worker: "w", Fair: true})
	require.NoError(t, err)
	require.True(t, res.OK)
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM tasks t JOIN runs r ON r.pk = t.run_pk WHERE r.id = $1 AND t.id = $2`,
		keep.Run.ID, res.Task.ID))
	res2, err := claim.Claim(b.ctx, b.dbs[0], claim.Request{Queue: "shared", Worker: "w", Fair: true})
	require.NoError(t, err)
	require.False(t, res2.OK)

	// Again: unchanged; unknown or another tenant's: 404.
	again, err := c.Cancel(b.ctx, st.Run.ID)
	require.NoError(t, err)
	require.Equal(t, run, again)
	status, _ := b.call(t, "POST", "/v1/runs/nope/cancel", secretA, nil)
	require.Equal(t, 404, status)
	status, _ = b.call(t, "POST", "/v1/runs/keep/cancel", secretB, nil)
	require.Equal(t, 404, status)

	// A completed run cannot be cancelled.
	require.NoError(t, claim.Complete(b.ctx, b.dbs[0], res.Task.ID, res.Task.LeaseToken, json.RawMessage(`{"ok":true}`)))
	_, err = c.Cancel(b.ctx, keep.Run.ID)
	var ae *api.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, 409, ae.Status)
	require.Equal(t, 0, b.count(t, 0, `SELECT running FROM tenant_running`))
}

func TestCancelRunningRun(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	events := b.runEvents(t, tenantOn[0])

	c := b.client(t, secretA)
	st, err := c.Start(b.ctx, "echo", "shared", nil, client.StartOptions{ID: "busy", Notify: true})
	require.NoError(t, err)
	res, err := claim.Claim(b.ctx, b.dbs[0], claim.Request{Queue: "shared", Worker: "w"})
	require.NoError(t, err)
	require.True(t, res.OK)
	got, err := c.Get(b.ctx, st.Run.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusRunning, got.Status)
	require.NotNil(t, got.ClaimedAt)

	run, err := c.Cancel(b.ctx, st.Run.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusCancelled, run.Status)
	require.Equal(t, 0, b.count(t, 0, `SELECT running FROM tenant_running`))
	ev := receive(t, events)
	require.Equal(t, "harvest.runs."+tenantOn[0]+".busy", ev.Subject)
	require.Equal(t, api.StatusCancelled, decode[api.Run](t, ev.Data).Status)

	// The worker learns at its next heartbeat, and its result is discarded.
	_, err = claim.Heartbeat(b.ctx, b.dbs[0], res.Task.ID, res.Task.LeaseToken, time.Minute)
	require.ErrorIs(t, err, claim.ErrStaleLease)
	err = claim.Complete(b.ctx, b.dbs[0], res.Task.ID, res.Task.LeaseToken, json.RawMessage(`1`))
	require.ErrorIs(t, err, claim.ErrStaleLease)
	got, err = c.Get(b.ctx, st.Run.ID)
	require.NoError(t, err)
	require.Equal(t, api.StatusCancelled, got.Status)
	require.Contains(t, []string{"", "null"}, string(got.Output), "the result was discarded")
}

// runEvents subscribes to the tenant's run events until the test ends.
func (b *bundle) runEvents(t *testing.T, tenant string) chan *natsMsg {
	t.Helper()
	events := make(chan *natsMsg, 16)
	sub, err := b.nc.Subscribe("harvest.runs."+tenant+".>", func(m *natsMsg) { events <- m })
	require.NoError(t, err)
	t.Cleanup(func() { sub.Unsubscribe() }) //nolint:errcheck
	require.NoError(t, b.nc.Flush())
	return events
}

// A cancel is announced like any other end of a run: only when the run
// asked for it. The gateway sends its messages in order, so had the first
// cancel been announced, its event would come first.
func TestCancelAnnouncedOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	events := b.runEvents(t, tenantOn[0])

	c := b.client(t, secretA)
	for _, o := range []client.StartOptions{{ID: "quiet"}, {ID: "told", Notify: true}} {
		_, err := c.Start(b.ctx, "echo", "shared", nil, o)
		require.NoError(t, err)
		run, err := c.Cancel(b.ctx, o.ID)
		require.NoError(t, err)
		require.Equal(t, api.StatusCancelled, run.Status)
	}
	ev := receive(t, events)
	require.Equal(t, "harvest.runs."+tenantOn[0]+".told", ev.Subject, "the first event is the run that asked for it")
}

func TestGetRunAndWait(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	c := b.client(t, secretA)
	st, err := c.Start(b.ctx, "echo", "shared", map[string]int{"n": 1}, clientOpts("w/1 x", ""))
	require.NoError(t, err)

	// Ids with a slash and a space survive the path.
	got, err := c.Get(b.ctx, "w/1 x")
	require.NoError(t, err)
	require.NotNil(t, got.Waiting, "GET says why a queued run waits")
	require.Equal(t, api.WaitNoWorker, got.Waiting.Reason)
	got.Waiting = nil
	require.Equal(t, st.Run, got)
	status, _ := b.call(t, "GET", "/v1/runs/"+url.PathEscape("w/1 x"), secretB, nil)
	require.Equal(t, 404, status, "another tenant's run is not found")

	// A wait that ends before the run does answers the run as it stands.
	run, err := c.Wait(b.ctx, st.Run.ID, 30*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, api.StatusQueued, run.Status)
	status, out := b.call(t, "GET", "/v1/runs/x?wait=soon", secretA, nil)
	require.Equal(t, 400, status)
	require.Equal(t, "wait", apiErr(t, out).Field)

	// A waiting reader is answered once the run completes.
	done := make(chan api.Run, 1)
	go func() {
		run, err := c.Wait(b.ctx, st.Run.ID, 30*time.Second)
		if err != nil {
			run.Status = api.Status(err.Error())
		}
		done <- run
	}()
	res, err := claim.Claim(b.ctx, b.dbs[0], claim.Request{Queue: "shared", Worker: "w"})
	require.NoError(t, err)
	require.NoError(t, claim.Complete(b.ctx, b.dbs[0], res.Task.ID, res.Task.LeaseToken, json.RawMessage(`{"echo":1}`)))
	run = <-done
	require.Equal(t, api.StatusCompleted, run.Status)
	require.JSONEq(t, `{"echo":1}`, string(run.Output))
	require.Equal(t, 1, run.Attempts)
	require.NotNil(t, run.ClaimedAt)
	require.NotNil(t, run.FinishedAt)
	require.False(t, run.FinishedAt.Before(run.ClaimedAt.Time))
}

func TestListRunsWithFiltersAndPaging(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	c := b.client(t, secretA)
	var ids []string
	for i := range 7 {
		name := []string{"echo", "resize"}[i%2]
		queue := []string{"q1", "q2", "q3"}[i%3]
		st, err := c.Start(b.ctx, name, queue, nil, clientOpts(fmt.Sprint("l", i), ""))
		require.NoError(t, err)
		ids = append(ids, st.Run.ID)
	}
	_, err := b.client(t, secretB).Start(b.ctx, "echo", "q1", nil, clientOpts("other", ""))
	require.NoError(t, err)
	_, err = c.Cancel(b.ctx, "l3")
	require.NoError(t, err)

	// All of them, newest first, three at a time.
	var seen []string
	cursor := ""
	for pages := 0; ; pages++ {
		require.Less(t, pages, 4)
		page, err := c.List(b.ctx, client.ListOptions{Limit: 3, Cursor: cursor})
		require.NoError(t, err)
		for _, r := range page.Runs {
			seen = append(seen, r.ID)
		}
		if page.NextCursor == "" {
			break
		}
		cursor = page.NextCursor
	}
	require.Equal(t, []string{"l6", "l5", "l4", "l3", "l2", "l1", "l0"}, seen)
	require.ElementsMatch(t, ids, seen)

	filter := func(o client.ListOptions) []string {
		page, err := c.List(b.ctx, o)
		require.NoError(t, err)
		var out []string
		for _, r := range page.Runs {
			out = append(out, r.ID)
		}
		return out
	}
	require.Equal(t, []string{"l6", "l3", "l0"}, filter(client.ListOptions{Queue: "q1"}))
	require.Equal(t, []string{"l5", "l3", "l1"}, filter(client.ListOptions{Name: "resize"}))
	require.Equal(t, []string{"l3"}, filter(client.ListOptions{Statuses: []api.Status{api.StatusCancelled}}))
	require.Equal(t, []string{"l6", "l0"}, filter(client.ListOptions{Queue: "q1", Statuses: []api.Status{api.StatusQueued, api.StatusRunning}}))

	for _, q := range []string{"status=done", "limit=0", "limit=1001", "cursor=abc", "sort=asc"} {
		status, out := b.call(t, "GET", "/v1/runs?"+q, secretA, nil)
		require.Equal(t, http.StatusBadRequest, status, q)
		require.NotEmpty(t, apiErr(t, out).Field, q)
	}
	status, out := b.call(t, "GET", "/v1/runs", secretB, nil)
	require.Equal(t, 200, status)
	list := decode[api.RunList](t, out)
	require.Len(t, list.Runs, 1, "a tenant lists its own runs only")
	require.Empty(t, list.NextCursor)
}

// A gateway's servers and handlers leave no goroutine behind once closed.
// Not parallel: parallel tests run after it, so it sees its own goroutines
// only.
func TestGatewayLeavesNoGoroutines(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	b := setup(t, setupOpts{})
	_, err := b.client(t, secretA).Start(b.ctx, "echo", "shared", nil, clientOpts("", ""))
	require.NoError(t, err)
	_, err = b.natsClient(t, tenantOn[1]).Start(b.ctx, "echo", "shared", nil, clientOpts("", ""))
	require.NoError(t, err)
	_, err = b.client(t, secretA).Wait(b.ctx, "missing", time.Millisecond)
	require.Error(t, err)
}
