package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/deferred"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/dispatch"
)

// Deferred starts (throttle, debounce, batch) end to end through the
// gateway. Firing is driven by calling deferred.Fire with a chosen time, or
// janitor.Tick, so no test waits for a period to pass unless it says so.

// deferredBody is a start of workflow echo on queue with extra fields.
func deferredBody(queue, extra string) string {
	return `{"name":"echo","queue":"` + queue + `"` + "," + extra + `}`
}

// startRun posts a start over HTTP and decodes the run; it requires want.
func (b *bundle) startRun(t *testing.T, secret string, want int, body string) api.Run {
	t.Helper()
	status, out := b.call(t, "POST", "/v1/runs", secret, body)
	require.Equal(t, want, status, string(out))
	return decode[api.Run](t, out)
}

// natsStartRun sends a start over NATS for tenant and decodes the run.
func (b *bundle) natsStartRun(t *testing.T, tenant string, want int, body string) api.Run {
	t.Helper()
	status, out := b.natsCall(t, "harvest.start."+tenant, body)
	require.Equal(t, want, status, string(out))
	return decode[api.Run](t, out)
}

func (b *bundle) getRun(t *testing.T, secret, id string) api.Run {
	t.Helper()
	status, out := b.call(t, "GET", "/v1/runs/"+id, secret, nil)
	require.Equal(t, 200, status, string(out))
	return decode[api.Run](t, out)
}

// fireAt fires what is due at now on a shard, as a janitor would.
func (b *bundle) fireAt(t *testing.T, shard int, now time.Time) deferred.FireReport {
	t.Helper()
	rep, err := deferred.Fire(b.ctx, b.dbs[shard], deferred.FireOptions{Shard: shard, Now: now})
	require.NoError(t, err)
	return rep
}

// wakes subscribes to the wake-ups of a queue on a shard.
func (b *bundle) wakes(t *testing.T, shard int, queue string) chan *nats.Msg {
	t.Helper()
	ch := make(chan *nats.Msg, 64)
	sub, err := b.nc.ChanSubscribe(dispatch.Subjects{}.Wake(shard, queue), ch)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, b.nc.Flush())
	return ch
}

func requireWake(t *testing.T, ch chan *nats.Msg, tasks int) {
	t.Helper()
	select {
	case m := <-ch:
		var w dispatch.Wake
		require.NoError(t, json.Unmarshal(m.Data, &w))
		require.Equal(t, tasks, w.Tasks)
	case <-time.After(5 * time.Second):
		t.Fatal("no wake-up published")
	}
}

func TestDeferredThrottleStartsUnderTheLimitThenQueuesInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	wakes := b.wakes(t, 0, "thr")
	thr := `"throttle":{"key":"acct","limit":2,"period":"1h"}`

	// Under the limit: an ordinary start, answered at once and announced.
	var started []api.Run
	for i := range 2 {
		run := b.startRun(t, secretA, 201, deferredBody("thr", fmt.Sprintf(`"id":"t%d",%s`, i, thr)))
		require.Equal(t, api.StatusQueued, run.Status)
		require.Equal(t, run.ID, run.RunID, "a throttled start fires a run with its own id")
		require.Equal(t, api.ModeThrottle, run.DeferMode)
		require.Nil(t, run.FiresAt)
		requireWake(t, wakes, 1)
		started = append(started, run)
	}
	// Over it: kept, in arrival order, each with the latest time it fires.
	// One arrives over NATS: the same start path.
	t2 := b.startRun(t, secretA, 201, deferredBody("thr", `"id":"t2",`+thr))
	t3 := b.natsStartRun(t, tenantOn[0], 201, deferredBody("thr", `"id":"t3",`+thr))
	for _, r := range []api.Run{t2, t3} {
		require.Equal(t, api.StatusDeferred, r.Status)
		require.NotNil(t, r.FiresAt)
		require.Equal(t, r.ID, r.RunID)
		require.Equal(t, api.ModeThrottle, r.DeferMode)
	}
	require.True(t, t2.FiresAt.Before(t3.FiresAt.Time), "arrival order: %s then %s", t2.FiresAt, t3.FiresAt)
	require.WithinDuration(t, started[0].CreatedAt.Add(time.Hour), t2.FiresAt.Time, time.Second)

	got := b.getRun(t, secretA, "t2")
	require.Equal(t, api.StatusDeferred, got.Status)
	require.Equal(t, t2.FiresAt.Time, got.FiresAt.Time)

	// Nothing is due before the slot; at t2's slot only t2 fires.
	require.Zero(t, b.fireAt(t, 0, t2.FiresAt.Add(-time.Millisecond)).Fired)
	rep := b.fireAt(t, 0, t2.FiresAt.Time)
	require.Equal(t, 1, rep.Fired)
	require.Equal(t, "t2", rep.Started[0].Params.Req.ID)
	require.Equal(t, api.StatusQueued, b.getRun(t, secretA, "t2").Status)
	require.Equal(t, api.StatusDeferred, b.getRun(t, secretA, "t3").Status)
	require.Equal(t, 1, b.fireAt(t, 0, t3.FiresAt.Time).Fired)
	got = b.getRun(t, secretA, "t3")
	require.Equal(t, api.StatusQueued, got.Status)
	require.Nil(t, got.FiresAt)

	require.Equal(t, 4, b.count(t, 0, `SELECT count(*) FROM tasks WHERE state = 'pending'`))
	require.Equal(t, 4, b.count(t, 0, `SELECT running FROM tenant_running WHERE tenant = $1`, tenantOn[0]))
	// A replay answers the current state with 200.
	status, out := b.call(t, "POST", "/v1/runs", secretA, deferredBody("thr", `"id":"t2",`+thr))
	require.Equal(t, 200, status, string(out))
	require.Equal(t, api.StatusQueued, decode[api.Run](t, out).Status)
}

func TestDeferredDebounceReplacesTheRequestAndFiresOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	deb := `"debounce":{"key":"doc-9","period":"1h","max_wait":"2h"}`
	d1 := b.startRun(t, secretA, 201, deferredBody("deb", `"id":"d1","input":{"rev":1},`+deb))
	d2 := b.natsStartRun(t, tenantOn[0], 201, deferredBody("deb", `"id":"d2","input":{"rev":2},`+deb))
	for _, r := range []api.Run{d1, d2} {
		require.Equal(t, api.StatusDeferred, r.Status)
		require.Equal(t, api.ModeDebounce, r.DeferMode)
		require.NotNil(t, r.FiresAt)
	}
	require.Equal(t, "d1", d1.ID)
	require.Equal(t, d1.RunID, d2.RunID, "one window, one run")
	require.NotEqual(t, "d1", d1.RunID, "the run gets a new id")
	require.True(t, d2.FiresAt.After(d1.FiresAt.Time), "the later start restarts the quiet period")
	got := b.getRun(t, secretA, "d1")
	require.Equal(t, api.StatusDeferred, got.Status)
	require.Equal(t, d2.FiresAt.Time, got.FiresAt.Time, "every start of the window shows when it fires")

	// An ordinary start cannot take a debounce start's id (409), over HTTP
	// and NATS, and writes nothing.
	status, out := b.call(t, "POST", "/v1/runs", secretA, startBody(`"id":"d1"`))
	require.Equal(t, 409, status, string(out))
	require.Equal(t, api.CodeConflict, apiErr(t, out).Code)
	status, out = b.natsCall(t, "harvest.start."+tenantOn[0], startBody(`"id":"d2"`))
	require.Equal(t, 409, status, string(out))
	status, out = b.call(t, "POST", "/v1/runs/batch", secretA, `{"runs":[`+startBody(`"id":"d1"`)+`]}`)
	require.Equal(t, 200, status, string(out))
	require.Equal(t, api.CodeConflict, decode[api.BatchStartResponse](t, out).Results[0].Error.Code)
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM runs`))
	require.Equal(t, 1, b.count(t, 0, `SELECT running FROM tenant_running WHERE tenant = $1`, tenantOn[0]))

	require.Zero(t, b.fireAt(t, 0, d2.FiresAt.Add(-time.Second)).Fired)
	require.Equal(t, 1, b.fireAt(t, 0, d2.FiresAt.Time).Fired)
	for _, id := range []string{"d1", "d2"} {
		got := b.getRun(t, secretA, id)
		require.Equal(t, api.StatusQueued, got.Status, id)
		require.Equal(t, id, got.ID)
		require.Equal(t, d1.RunID, got.RunID)
		require.Nil(t, got.FiresAt)
	}
	run := b.getRun(t, secretA, d1.RunID)
	require.Equal(t, d1.RunID, run.ID)
	var input string
	require.NoError(t, b.dbs[0].QueryRow(b.ctx, `SELECT input::text FROM tasks`).Scan(&input))
	require.JSONEq(t, `{"rev":2}`, input, "the last start's input")

	// Replay: 200 with the run; the same id with another request: 409.
	status, out = b.call(t, "POST", "/v1/runs", secretA, deferredBody("deb", `"id":"d1","input":{"rev":1},`+deb))
	require.Equal(t, 200, status, string(out))
	require.Equal(t, d1.RunID, decode[api.Run](t, out).RunID)
	status, out = b.call(t, "POST", "/v1/runs", secretA, deferredBody("deb", `"id":"d1","input":{"rev":7},`+deb))
	require.Equal(t, 409, status, string(out))
	// The next start of the key opens a new window.
	d3 := b.startRun(t, secretA, 201, deferredBody("deb", `"id":"d3",`+deb))
	require.Equal(t, api.StatusDeferred, d3.Status)
	require.NotEqual(t, d1.RunID, d3.RunID)
}

func TestDeferredBatchFillsAndEveryMemberResolvesToTheOneRun(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	wakes := b.wakes(t, 0, "bat")
	bat := `"quota_key":"acct-42","batch":{"key":"inv","max_size":3,"max_wait":"1h"}`
	items := make([]string, 3)
	for i := range items {
		items[i] = deferredBody("bat", fmt.Sprintf(`"id":"m%d","input":{"invoice":%d},%s`, i, i, bat))
	}
	status, out := b.call(t, "POST", "/v1/runs/batch", secretA, `{"runs":[`+strings.Join(items, ",")+`]}`)
	require.Equal(t, 200, status, string(out))
	res := decode[api.BatchStartResponse](t, out).Results
	require.Len(t, res, 3)
	for i, r := range res {
		require.Nil(t, r.Error, "item %d", i)
		require.Equal(t, api.ModeBatch, r.Run.DeferMode)
		require.Equal(t, res[0].Run.RunID, r.Run.RunID)
	}
	require.Equal(t, api.StatusDeferred, res[0].Run.Status)
	require.NotNil(t, res[0].Run.FiresAt)
	require.Equal(t, api.StatusQueued, res[2].Run.Status, "the member that fills the batch fires it")
	requireWake(t, wakes, 1)

	runID := res[0].Run.RunID
	for i := range 3 {
		got := b.getRun(t, secretA, fmt.Sprint("m", i))
		require.Equal(t, api.StatusQueued, got.Status)
		require.Equal(t, runID, got.RunID)
		require.Equal(t, "acct-42", got.FairnessKey, "the fired run's key is its quota key")
	}
	var input string
	require.NoError(t, b.dbs[0].QueryRow(b.ctx, `SELECT input::text FROM tasks`).Scan(&input))
	require.JSONEq(t, `[{"invoice":0},{"invoice":1},{"invoice":2}]`, input)

	// Over NATS: the batch-start subject, a batch of two, then one that
	// waits for max_wait and fires then.
	nb := `"batch":{"key":"n","max_size":2,"max_wait":"1h"}`
	status, out = b.natsCall(t, "harvest.start_batch."+tenantOn[0],
		`{"runs":[`+deferredBody("bat", `"id":"n0",`+nb)+`,`+deferredBody("bat", `"id":"n1",`+nb)+`]}`)
	require.Equal(t, 200, status, string(out))
	res = decode[api.BatchStartResponse](t, out).Results
	require.Equal(t, api.StatusQueued, res[1].Run.Status)
	require.Equal(t, res[0].Run.RunID, res[1].Run.RunID)
	requireWake(t, wakes, 1)
	lone := b.natsStartRun(t, tenantOn[0], 201, deferredBody("bat", `"id":"n2",`+nb))
	require.Equal(t, api.StatusDeferred, lone.Status)
	require.Equal(t, 1, b.fireAt(t, 0, lone.FiresAt.Time).Fired)
	require.Equal(t, api.StatusQueued, b.getRun(t, secretA, "n2").Status)
	require.NoError(t, b.dbs[0].QueryRow(b.ctx, `SELECT t.input::text FROM tasks t JOIN runs r ON r.pk = t.run_pk WHERE r.id = $1`,
		lone.RunID).Scan(&input))
	require.JSONEq(t, `[null]`, input)
	require.Equal(t, 3, b.count(t, 0, `SELECT count(*) FROM runs`))
}

// The 400 rule of deferred starts over both transports: fairness_key is
// refused, and a batch member that disagrees with its open batch on name
// or quota key is refused naming the field, with nothing written.
func TestDeferredRefusalsOverHTTPAndNATS(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	bat := `"batch":{"key":"k","max_size":10,"max_wait":"1h"}`
	open := b.startRun(t, secretA, 201, deferredBody("bq", `"id":"first","quota_key":"q1",`+bat))
	require.Equal(t, api.StatusDeferred, open.Status)

	cases := []struct {
		name, body, field string
	}{
		{"throttle with fairness_key", deferredBody("bq", `"fairness_key":"k","throttle":{"limit":1,"period":"1s"}`), "fairness_key"},
		{"debounce with fairness_key", deferredBody("bq", `"fairness_key":"k","debounce":{"period":"1s"}`), "fairness_key"},
		{"batch with fairness_key", deferredBody("bq", `"fairness_key":"k","quota_key":"q1",`+bat), "fairness_key"},
		{"member with another name", `{"name":"other","queue":"bq","quota_key":"q1",` + bat + `}`, "name"},
		{"member with another quota key", deferredBody("bq", `"quota_key":"q2",`+bat), "quota_key"},
		{"member without the quota key", deferredBody("bq", bat), "quota_key"},
		{"two modes", deferredBody("bq", `"debounce":{"period":"1s"},`+bat), "batch"},
		{"delay", deferredBody("bq", `"delay":"1s","debounce":{"period":"1s"}`), "delay"},
		{"unknown mode field", deferredBody("bq", `"throttle":{"limit":1,"period":"1s","burst":2}`), "throttle.burst"},
		{"bad max_wait", deferredBody("bq", `"debounce":{"period":"1m","max_wait":"1s"}`), "debounce.max_wait"},
		{"batch too large", deferredBody("bq", `"batch":{"max_size":1001,"max_wait":"1s"}`), "batch.max_size"},
	}
	for _, c := range cases {
		status, out := b.call(t, "POST", "/v1/runs", secretA, c.body)
		require.Equal(t, 400, status, "%s over HTTP: %s", c.name, out)
		e := apiErr(t, out)
		require.Equal(t, c.field, e.Field, "%s over HTTP: %s", c.name, e.Message)

		status, out = b.natsCall(t, "harvest.start."+tenantOn[0], c.body)
		require.Equal(t, 400, status, "%s over NATS: %s", c.name, out)
		require.Equal(t, c.field, apiErr(t, out).Field, "%s over NATS", c.name)

		status, out = b.natsCall(t, "harvest.start_batch."+tenantOn[0], `{"runs":[`+c.body+`]}`)
		require.Equal(t, 200, status, "%s in a NATS batch: %s", c.name, out)
		item := decode[api.BatchStartResponse](t, out).Results[0]
		require.NotNil(t, item.Error, c.name)
		require.Equal(t, c.field, item.Error.Field, "%s in a NATS batch", c.name)
	}
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM runs`))
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM deferred_starts`))
	require.Equal(t, 1, b.count(t, 0, `SELECT size FROM deferred_groups`))
}

// What one gateway accepted, another (a restart) serves and a new firer
// fires; a batch opened on the first is filled on the second.
func TestDeferredStartsSurviveAGatewayRestart(t *testing.T) {
	t.Parallel()
	a := setup(t, setupOpts{})
	thr := `"throttle":{"limit":1,"period":"1h"}`
	a.startRun(t, secretA, 201, deferredBody("r", `"id":"s1",`+thr))
	s2 := a.startRun(t, secretA, 201, deferredBody("r", `"id":"s2",`+thr))
	w1 := a.startRun(t, secretA, 201, deferredBody("r", `"id":"w1","debounce":{"period":"1h"}`))
	bat := `"batch":{"max_size":2,"max_wait":"1h"}`
	m1 := a.startRun(t, secretA, 201, deferredBody("r", `"id":"m1",`+bat))
	a.srv.Close()
	a.gw.Close()

	b := setup(t, setupOpts{Shards: a.urls, NATSURL: a.natsURL})
	for _, id := range []string{"s2", "w1", "m1"} {
		got := b.getRun(t, secretA, id)
		require.Equal(t, api.StatusDeferred, got.Status, id)
		require.NotNil(t, got.FiresAt, id)
	}
	m2 := b.startRun(t, secretA, 201, deferredBody("r", `"id":"m2",`+bat))
	require.Equal(t, api.StatusQueued, m2.Status)
	require.Equal(t, m1.RunID, m2.RunID)

	// A firer that never saw these starts fires them.
	later := s2.FiresAt.Add(time.Minute)
	require.True(t, later.After(w1.FiresAt.Time))
	rep := b.fireAt(t, 0, later)
	require.Equal(t, 2, rep.Fired)
	for _, id := range []string{"s1", "s2", "w1", "m1", "m2"} {
		require.Equal(t, api.StatusQueued, b.getRun(t, secretA, id).Status, id)
	}
	require.Equal(t, 4, b.count(t, 0, `SELECT count(*) FROM tasks`))
	require.Zero(t, b.fireAt(t, 0, later.Add(time.Hour)).Fired)
}

// Admission is decided when a deferred start is accepted: a start that
// adds a run over the tenant's limit, or joins an open window at it, gets
// 429 and writes nothing; a cancel frees the slot.
func TestDeferredAdmissionAtAcceptance(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{Tokens: eightTenants(t)})
	putAdmission(t, b, `{"algorithm": "static", "tfm": 1}`) // limit 16
	fillRuns(t, b, tenantOn[0], 15)

	w := b.startRun(t, secretA, 201, deferredBody("adm", `"id":"w1","debounce":{"key":"a","period":"1h"}`))
	require.Equal(t, api.StatusDeferred, w.Status)
	u, err := b.client(t, secretA).Usage(b.ctx)
	require.NoError(t, err)
	require.Equal(t, 16, u.Running, "the waiting run holds its slot")
	over := []string{
		deferredBody("adm", `"id":"w2","debounce":{"key":"a","period":"1h"}`), // joins w1's window
		deferredBody("adm", `"id":"x1","debounce":{"key":"b","period":"1h"}`),
		deferredBody("adm", `"id":"x2","batch":{"max_size":5,"max_wait":"1h"}`),
		deferredBody("adm", `"id":"x3","throttle":{"limit":5,"period":"1h"}`),
	}
	for _, body := range over {
		status, out := b.call(t, "POST", "/v1/runs", secretA, body)
		require.Equal(t, 429, status, string(out))
		require.Equal(t, api.CodeOverLimit, apiErr(t, out).Code)
		status, out = b.natsCall(t, "harvest.start."+tenantOn[0], body)
		require.Equal(t, 429, status, string(out))
	}
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM deferred_groups`))
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM deferred_starts`))
	require.Zero(t, b.count(t, 0, `SELECT count(*) FROM runs WHERE id LIKE 'x%'`))
	require.Equal(t, 16, b.count(t, 0, `SELECT running FROM tenant_running WHERE tenant = $1`, tenantOn[0]))

	// Firing does not ask again: the slot passes to the run.
	require.Equal(t, 1, b.fireAt(t, 0, w.FiresAt.Add(time.Hour)).Fired)
	require.Equal(t, 16, b.count(t, 0, `SELECT running FROM tenant_running WHERE tenant = $1`, tenantOn[0]))
	// Cancelling the window (by a start's id) frees the slot.
	status, out := b.call(t, "POST", "/v1/runs/w1/cancel", secretA, nil)
	require.Equal(t, 200, status, string(out))
	require.Equal(t, api.StatusCancelled, decode[api.Run](t, out).Status)
	b.startRun(t, secretA, 201, over[0])
}

// Cancelling a deferred start's id cancels what it stands for, whether it
// still waits or has fired, and a cancel racing the firing always ends
// with the run cancelled.
func TestDeferredCancel(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	thr := `"throttle":{"limit":1,"period":"1h"}`
	b.startRun(t, secretA, 201, deferredBody("c", `"id":"c1",`+thr))
	c2 := b.startRun(t, secretA, 201, deferredBody("c", `"id":"c2",`+thr))
	status, out := b.call(t, "POST", "/v1/runs/c2/cancel", secretA, nil)
	require.Equal(t, 200, status, string(out))
	require.Equal(t, api.StatusCancelled, decode[api.Run](t, out).Status)
	require.Zero(t, b.fireAt(t, 0, c2.FiresAt.Add(time.Hour)).Fired, "a cancelled throttled start never fires")
	require.Equal(t, api.StatusCancelled, b.getRun(t, secretA, "c2").Status)
	require.Equal(t, 1, b.count(t, 0, `SELECT running FROM tenant_running WHERE tenant = $1`, tenantOn[0]))

	// A fired batch: any member's id cancels the one run.
	bat := `"batch":{"key":"cb","max_size":2,"max_wait":"1h"}`
	b.startRun(t, secretA, 201, deferredBody("c", `"id":"b1",`+bat))
	b2 := b.startRun(t, secretA, 201, deferredBody("c", `"id":"b2",`+bat))
	require.Equal(t, api.StatusQueued, b2.Status)
	status, out = b.call(t, "POST", "/v1/runs/b1/cancel", secretA, nil)
	require.Equal(t, 200, status, string(out))
	got := decode[api.Run](t, out)
	require.Equal(t, "b1", got.ID)
	require.Equal(t, b2.RunID, got.RunID)
	require.Equal(t, api.StatusCancelled, got.Status)
	require.Equal(t, api.StatusCancelled, b.getRun(t, secretA, b2.RunID).Status)
	require.Equal(t, api.StatusCancelled, b.getRun(t, secretA, "b2").Status)

	// A waiter on a start's id hears of its cancel.
	deb := b.startRun(t, secretA, 201, deferredBody("c", `"id":"e1","debounce":{"key":"e","period":"1h"}`))
	waited := make(chan api.Run, 1)
	go func() {
		status, out := b.call(t, "GET", "/v1/runs/e1?wait=20s", secretA, nil)
		if status != 200 {
			close(waited)
			return
		}
		var r api.Run
		_ = json.Unmarshal(out, &r)
		waited <- r
	}()
	time.Sleep(50 * time.Millisecond)
	status, out = b.call(t, "POST", "/v1/runs/e1/cancel", secretA, nil)
	require.Equal(t, 200, status, string(out))
	select {
	case r := <-waited:
		require.Equal(t, api.StatusCancelled, r.Status)
		require.Equal(t, deb.RunID, r.RunID)
	case <-time.After(10 * time.Second):
		t.Fatal("the wait did not end with the cancel")
	}

	// Cancel racing the firing, many times: the run ends cancelled either
	// way, with no task left to claim.
	const n = 12
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint("race-", i)
		b.startRun(t, secretA, 201, deferredBody("c", fmt.Sprintf(`"id":%q,"debounce":{"key":%q,"period":"1ms"}`, ids[i], ids[i])))
	}
	time.Sleep(5 * time.Millisecond)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Go(func() {
			_, err := deferred.Fire(context.Background(), b.dbs[0], deferred.FireOptions{})
			require.NoError(t, err)
		})
		wg.Go(func() {
			status, out := b.call(t, "POST", "/v1/runs/"+id+"/cancel", secretA, nil)
			require.Equal(t, 200, status, string(out))
			require.Equal(t, api.StatusCancelled, decode[api.Run](t, out).Status)
		})
	}
	wg.Wait()
	for _, id := range ids {
		require.Equal(t, api.StatusCancelled, b.getRun(t, secretA, id).Status, id)
	}
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM tasks WHERE state <> 'done'`), "c1's task alone")
	require.Zero(t, b.count(t, 0, `SELECT count(*) FROM deferred_groups WHERE state = 'pending'`))
	require.Zero(t, b.fireAt(t, 0, time.Now().Add(time.Hour)).Fired)
	require.Equal(t, 1, b.count(t, 0, `SELECT running FROM tenant_running WHERE tenant = $1`, tenantOn[0]), "only c1 is unfinished")
}

// Under key binding a deferred start binds its quota key, which its run
// takes as its fairness key: no tenant can reach another's key.
func TestDeferredKeyBindingBindsTheQuotaKey(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{KeyBinding: true})
	tenant := tenantOn[0]
	thr := b.startRun(t, secretA, 201, deferredBody("kb", `"throttle":{"limit":5,"period":"1h"}`))
	require.Equal(t, api.StatusQueued, thr.Status)
	require.Equal(t, tenant, thr.FairnessKey)
	require.Equal(t, tenant, thr.QuotaKey)

	// Naming another tenant's bound key as quota key lands under one's own.
	other := tenantOn[1]
	w := b.startRun(t, secretA, 201, deferredBody("kb", `"quota_key":"`+other+`","debounce":{"period":"1h"}`))
	require.Equal(t, tenant+"/"+other, w.QuotaKey)
	require.Equal(t, 1, b.fireAt(t, 0, w.FiresAt.Time).Fired)
	run := b.getRun(t, secretA, w.ID)
	require.Equal(t, tenant+"/"+other, run.FairnessKey)
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM tasks WHERE fairness_key = $1`, tenant+"/"+other))

	status, out := b.call(t, "POST", "/v1/runs", secretA, deferredBody("kb", `"fairness_key":"x","debounce":{"period":"1h"}`))
	require.Equal(t, 400, status, string(out))
	require.Equal(t, "fairness_key", apiErr(t, out).Field)
	status, out = b.call(t, "POST", "/v1/runs", secretA, deferredBody("kb", `"quota_key":"`+strings.Repeat("q", 256)+`","debounce":{"period":"1h"}`))
	require.Equal(t, 400, status, string(out))
	e := apiErr(t, out)
	require.Equal(t, "quota_key", e.Field)
	require.Contains(t, e.Message, "bound to the tenant")
}
