package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/sourcegraph/conc/pool"
	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/runstore"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

func TestHTTPStartWritesRunTaskAndCount(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	req, err := http.NewRequest(http.MethodPost, b.srv.URL+"/v1/runs",
		strings.NewReader(`{"name":"echo","queue":"shared","input":{"n":1},"quota_key":"q-1","priority":-7}`))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+secretA)
	req.Header.Set("traceparent", "00-"+traceID+"-00f067aa0ba902b7-01")
	resp, err := b.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, resp.StatusCode, "answer: %s", body)
	var run api.Run
	require.NoError(t, json.Unmarshal(body, &run))

	id, err := uuid.Parse(run.ID)
	require.NoError(t, err, "a start without an id gets a UUID")
	require.Equal(t, uuid.Version(7), id.Version())
	require.Equal(t, "/v1/runs/"+run.ID, resp.Header.Get("Location"))
	require.Equal(t, tenantOn[0], run.Tenant)
	require.Equal(t, 0, run.Shard, "the tenant's home shard")
	require.Equal(t, "q-1", run.FairnessKey, "the quota key stands in for the fairness key")
	require.Equal(t, "q-1", run.QuotaKey)
	require.Equal(t, -7, run.Priority)
	require.Equal(t, api.StatusQueued, run.Status)
	require.False(t, run.CreatedAt.IsZero())

	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM runs WHERE id = $1 AND tenant = $2`, run.ID, tenantOn[0]))
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM tasks WHERE state = 'pending' AND fairness_key = 'q-1'`))
	require.Equal(t, 1, b.count(t, 0, `SELECT running FROM tenant_running WHERE tenant = $1`, tenantOn[0]))
	require.Equal(t, 0, b.count(t, 1, `SELECT count(*) FROM runs`), "nothing on the other shard")

	// The start span continues the caller's trace, and its context is
	// stored with the task.
	var tc map[string]string
	require.NoError(t, b.dbs[0].QueryRow(b.ctx, `SELECT trace_context FROM tasks`).Scan(&tc))
	require.Contains(t, tc["traceparent"], traceID)
	require.NotContains(t, tc["traceparent"], "00f067aa0ba902b7", "the task links to the start span, a child of the caller's")
}

// A quota key that is no valid fairness key does not refuse the start: it
// is the run's quota key, and the run falls back to the default key.
func TestQuotaKeyThatIsNoFairnessKeyFallsBackToTheDefaultKey(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	status, out := b.call(t, "POST", "/v1/runs", secretA, `{"name":"echo","queue":"shared","quota_key":" acct 7 "}`)
	require.Equal(t, 201, status, string(out))
	var run api.Run
	require.NoError(t, json.Unmarshal(out, &run))
	require.Equal(t, " acct 7 ", run.QuotaKey)
	require.Equal(t, "", run.FairnessKey)
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM tasks WHERE fairness_key = '' AND quota_key = ' acct 7 '`))
}

func TestStartReplayAndConflictOverHTTPAndNATS(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	body := `{"id":"order-1","name":"echo","queue":"shared","input":{"a":1,"b":2}}`
	status, out := b.call(t, "POST", "/v1/runs", secretB, body)
	require.Equal(t, 201, status, string(out))
	first := decode[api.Run](t, out)
	require.Equal(t, 1, first.Shard)

	// The same request, keys in another order, over HTTP then NATS: 200.
	replay := `{"id":"order-1","name":"echo","queue":"shared","input":{"b":2,"a":1}}`
	status, out = b.call(t, "POST", "/v1/runs", secretB, replay)
	require.Equal(t, 200, status, string(out))
	require.Equal(t, first, decode[api.Run](t, out))
	status, out = b.natsCall(t, "harvest.start."+tenantOn[1], replay)
	require.Equal(t, 200, status, string(out))
	require.Equal(t, first, decode[api.Run](t, out))

	// A different request with the same id: 409 over both.
	other := `{"id":"order-1","name":"echo","queue":"shared","input":{"a":2}}`
	status, out = b.call(t, "POST", "/v1/runs", secretB, other)
	require.Equal(t, 409, status)
	require.Equal(t, api.CodeConflict, apiErr(t, out).Code)
	status, out = b.natsCall(t, "harvest.start."+tenantOn[1], other)
	require.Equal(t, 409, status)
	e := apiErr(t, out)
	require.Equal(t, 409, e.Status, "the status travels inside the JSON over NATS")
	require.Equal(t, api.CodeConflict, e.Code)

	require.Equal(t, 1, b.count(t, 1, `SELECT count(*) FROM runs`))
	require.Equal(t, 1, b.count(t, 1, `SELECT count(*) FROM tasks`))
	require.Equal(t, 1, b.count(t, 1, `SELECT running FROM tenant_running`))
}

func TestNATSStartAnswersLikeHTTP(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	status, out := b.natsCall(t, "harvest.start."+tenantOn[0], `{"name":"echo","queue":"shared","fairness_key":"k1"}`)
	require.Equal(t, 201, status, string(out))
	run := decode[api.Run](t, out)
	require.Equal(t, tenantOn[0], run.Tenant)
	require.Equal(t, "k1", run.FairnessKey)
	require.Equal(t, api.StatusQueued, run.Status)

	got, err := b.client(t, secretA).Get(b.ctx, run.ID)
	require.NoError(t, err)
	require.NotNil(t, got.Waiting, "only GET says why a queued run waits")
	got.Waiting = nil
	require.Equal(t, run, got, "the NATS answer is the run resource")

	// The typed client over NATS.
	st, err := b.natsClient(t, tenantOn[0]).Start(b.ctx, "echo", "shared", map[string]int{"x": 1},
		clientOpts("c-1", "k2"))
	require.NoError(t, err)
	require.True(t, st.Created)
	require.Equal(t, "c-1", st.Run.ID)
	st, err = b.natsClient(t, tenantOn[0]).Start(b.ctx, "echo", "shared", map[string]int{"x": 1}, clientOpts("c-1", "k2"))
	require.NoError(t, err)
	require.False(t, st.Created, "a replay")
}

func TestBatchStartEachItemOnItsOwn(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	body := `{"runs":[
		{"id":"b-1","name":"echo","queue":"shared","fairness_key":"k"},
		{"id":"b-2","name":"echo","queue":"..","fairness_key":"k"},
		{"id":"b-3","name":"echo","queue":"shared","bogus":1},
		{"id":"b-4","name":"echo","queue":"shared","input":"\u0000"},
		{"id":"b-5","name":"echo","queue":"shared","priority":-5}
	]}`
	for _, via := range []string{"http", "nats"} {
		var status int
		var out []byte
		if via == "http" {
			status, out = b.call(t, "POST", "/v1/runs/batch", secretA, body)
		} else {
			status, out = b.natsCall(t, "harvest.start_batch."+tenantOn[0], body)
		}
		require.Equal(t, 200, status, string(out))
		res := decode[api.BatchStartResponse](t, out).Results
		require.Len(t, res, 5)
		require.NotNil(t, res[0].Run, via)
		require.Equal(t, "b-1", res[0].Run.ID)
		require.Equal(t, "k", res[0].Run.FairnessKey)
		require.Equal(t, "queue", res[1].Error.Field)
		require.Equal(t, "bogus", res[2].Error.Field)
		require.Equal(t, "input", res[3].Error.Field)
		require.Equal(t, 400, res[3].Error.Status)
		require.NotNil(t, res[4].Run, via)
		require.Equal(t, -5, res[4].Run.Priority)
	}
	require.Equal(t, 2, b.count(t, 0, `SELECT count(*) FROM runs`))
	require.Equal(t, 2, b.count(t, 0, `SELECT count(*) FROM tasks`))
	require.Equal(t, 2, b.count(t, 0, `SELECT running FROM tenant_running`))

	// The typed client, and the limits of the batch itself.
	res, err := b.client(t, secretA).StartBatch(b.ctx, []api.StartRequest{{ID: "b-6", Name: "echo", Queue: "shared"}})
	require.NoError(t, err)
	require.Equal(t, "b-6", res[0].Run.ID)
	status, out := b.call(t, "POST", "/v1/runs/batch", secretA, `{"items":[]}`)
	require.Equal(t, 400, status)
	require.Equal(t, "items", apiErr(t, out).Field)
	status, out = b.call(t, "POST", "/v1/runs/batch", secretA, `{}`)
	require.Equal(t, 400, status)
	require.Equal(t, "runs", apiErr(t, out).Field)
	many := `{"runs":[` + strings.TrimSuffix(strings.Repeat(`{"name":"e","queue":"q"},`, api.MaxBatchItems+1), ",") + `]}`
	status, out = b.call(t, "POST", "/v1/runs/batch", secretA, many)
	require.Equal(t, 400, status)
	require.Equal(t, "runs", apiErr(t, out).Field)
}

// Every bad start names its field and leaves nothing behind, over HTTP and
// NATS alike.
func TestBadStartsLeaveNothingBehind(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{MaxBodyBytes: 4096})
	cases := []struct {
		name   string
		body   string
		status int
		field  string
	}{
		{"unknown field", startBody(`"fairnes_key":"k"`), 400, "fairnes_key"},
		{"bad queue", `{"name":"echo","queue":" shared"}`, 400, "queue"},
		{"dot queue", `{"name":"echo","queue":"."}`, 400, "queue"},
		{"missing queue", `{"name":"echo"}`, 400, "queue"},
		{"missing name", `{"queue":"shared"}`, 400, "name"},
		{"empty key", startBody(`"fairness_key":""`), 400, "fairness_key"},
		{"dot-dot key", startBody(`"fairness_key":".."`), 400, "fairness_key"},
		{"key with control char", startBody(`"fairness_key":"a\u0007b"`), 400, "fairness_key"},
		{"key outer space", startBody(`"fairness_key":"k "`), 400, "fairness_key"},
		{"long key", startBody(`"fairness_key":"` + strings.Repeat("k", 257) + `"`), 400, "fairness_key"},
		{"empty quota key", startBody(`"quota_key":""`), 400, "quota_key"},
		{"long quota key", startBody(`"quota_key":"` + strings.Repeat("q", 257) + `"`), 400, "quota_key"},
		{"NUL in quota key", startBody(`"quota_key":"a\u0000"`), 400, "quota_key"},
		{"priority high", startBody(`"priority":1001`), 400, "priority"},
		{"priority low", startBody(`"priority":-1001`), 400, "priority"},
		{"priority not integer", startBody(`"priority":1.5`), 400, "priority"},
		{"priority string", startBody(`"priority":"high"`), 400, "priority"},
		{"max attempts", startBody(`"max_attempts":0`), 400, "max_attempts"},
		{"bad delay", startBody(`"delay":"soon"`), 400, "delay"},
		{"bad run_at", startBody(`"run_at":"tomorrow"`), 400, "run_at"},
		{"run_at and delay", startBody(`"run_at":"2030-01-01T00:00:00Z","delay":"1s"`), 400, "delay"},
		{"zero timeout", startBody(`"timeout":"0s"`), 400, "timeout"},
		{"id not a string", startBody(`"id":7`), 400, "id"},
		{"notify not a boolean", startBody(`"notify":"yes"`), 400, "notify"},
		{"id with newline", startBody(`"id":"a\nb"`), 400, "id"},
		{"NUL in input", `{"name":"echo","queue":"shared","input":{"s":"\u0000"}}`, 400, "input"},
		{"throttle with key", startBody(`"fairness_key":"k","throttle":{"limit":1}`), 400, "fairness_key"},
		{"debounce with key", startBody(`"fairness_key":"k","debounce":{}`), 400, "fairness_key"},
		{"batch with key", startBody(`"fairness_key":"k","batch":{}`), 400, "fairness_key"},
		{"throttle without period", startBody(`"throttle":{"limit":1}`), 400, "throttle.period"},
		{"not json", `{"name":`, 400, ""},
		{"not an object", `[1,2]`, 400, ""},
		{"empty body", ``, 400, ""},
		{"trailing data", startBody("") + ` {}`, 400, ""},
		{"too large", startBody(`"input":"` + strings.Repeat("x", 5000) + `"`), 413, ""},
	}
	for _, c := range cases {
		status, out := b.call(t, "POST", "/v1/runs", secretA, c.body)
		require.Equal(t, c.status, status, "%s over HTTP: %s", c.name, out)
		e := apiErr(t, out)
		require.Equal(t, c.status, e.Status, c.name)
		require.Equal(t, c.field, e.Field, "%s: %s", c.name, e.Message)
		require.NotEmpty(t, e.Message)

		status, out = b.natsCall(t, "harvest.start."+tenantOn[0], c.body)
		require.Equal(t, c.status, status, "%s over NATS: %s", c.name, out)
		e = apiErr(t, out)
		require.Equal(t, c.status, e.Status, c.name)
		require.Equal(t, c.field, e.Field, c.name)
	}
	b.nothingWritten(t, "after every bad start")
}

func TestStartRoutesToHomeShard(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for shard, secret := range []string{secretA, secretB} {
		st, err := b.client(t, secret).Start(b.ctx, "echo", "shared", nil, clientOpts("", ""))
		require.NoError(t, err)
		require.Equal(t, shard, st.Run.Shard)
		require.Equal(t, 1, b.count(t, shard, `SELECT count(*) FROM runs WHERE id = $1`, st.Run.ID))
	}
}

// When a tenant's home shard is down, its starts and reads get 503 and the
// other tenants keep working.
func TestShardDown(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{DeadShard1: true})
	status, out := b.call(t, "POST", "/v1/runs", secretB, startBody(""))
	require.Equal(t, 503, status, string(out))
	e := apiErr(t, out)
	require.Equal(t, api.CodeUnavailable, e.Code)
	require.Contains(t, e.Message, "shard 1")
	status, out = b.natsCall(t, "harvest.start."+tenantOn[1], startBody(""))
	require.Equal(t, 503, status, string(out))
	status, _ = b.call(t, "POST", "/v1/runs/batch", secretB, `{"runs":[`+startBody("")+`]}`)
	require.Equal(t, 503, status)
	status, _ = b.call(t, "GET", "/v1/runs/x", secretB, nil)
	require.Equal(t, 503, status)
	status, _ = b.call(t, "GET", "/v1/runs", secretB, nil)
	require.Equal(t, 503, status)
	status, _ = b.call(t, "POST", "/v1/runs/x/cancel", secretB, nil)
	require.Equal(t, 503, status)

	status, out = b.call(t, "POST", "/v1/runs", secretA, startBody(""))
	require.Equal(t, 201, status, string(out))
	status, out = b.natsCall(t, "harvest.start."+tenantOn[0], startBody(""))
	require.Equal(t, 201, status, string(out))

	status, out = b.call(t, "GET", "/readyz", "", nil)
	require.Equal(t, 503, status)
	require.Contains(t, string(out), `"ok":false`)
	status, _ = b.call(t, "GET", "/healthz", "", nil)
	require.Equal(t, 200, status)
}

// Two gateways receiving the same start at once make exactly one run.
func TestTwoGatewaysRacingMakeOneRun(t *testing.T) {
	t.Parallel()
	b1 := setup(t, setupOpts{})
	b2 := setup(t, setupOpts{Shards: b1.urls, NATSURL: b1.natsURL})
	const n = 24
	statuses := make([]int, n)
	p := pool.New()
	for i := range n {
		gw := []*bundle{b1, b2}[i%2]
		p.Go(func() {
			statuses[i], _ = gw.call(t, "POST", "/v1/runs", secretA, `{"id":"same","name":"echo","queue":"shared"}`)
		})
	}
	p.Wait()
	created := 0
	for _, s := range statuses {
		require.Contains(t, []int{200, 201}, s)
		if s == 201 {
			created++
		}
	}
	require.Equal(t, 1, created)
	require.Equal(t, 1, b1.count(t, 0, `SELECT count(*) FROM runs`))
	require.Equal(t, 1, b1.count(t, 0, `SELECT count(*) FROM tasks`))
	require.Equal(t, 1, b1.count(t, 0, `SELECT running FROM tenant_running`))
}

// Many concurrent starts share commits and all land.
func TestConcurrentStartsAllCommit(t *testing.T) {
	t.Parallel()
	// More starts than the default system limit: raise it explicitly.
	b := setup(t, setupOpts{MaxRuns: 1000})
	c := b.natsClient(t, tenantOn[0])
	const n = 200
	p := pool.New().WithErrors().WithMaxGoroutines(32)
	for i := range n {
		p.Go(func() error {
			_, err := c.Start(b.ctx, "echo", fmt.Sprintf("q%d", i%3), nil, clientOpts("", fmt.Sprintf("k%d", i%7)))
			return err
		})
	}
	require.NoError(t, p.Wait())
	require.Equal(t, n, b.count(t, 0, `SELECT count(*) FROM runs`))
	require.Equal(t, n, b.count(t, 0, `SELECT count(*) FROM tasks WHERE state = 'pending'`))
	require.Equal(t, n, b.count(t, 0, `SELECT running FROM tenant_running`))
	// Every key's first task was announced to the fair claimers: folding
	// the arrivals leaves nothing for a repair from the task rows to fix.
	reps, err := claim.Repair(b.ctx, b.dbs[0])
	require.NoError(t, err)
	require.Len(t, reps, 3)
	for _, r := range reps {
		require.Zero(t, r.Repaired, "queue %s", r.Queue)
	}
}

func TestWakeAndDispatchAfterCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	wakes := make(chan *nats.Msg, 16)
	dispatches := make(chan *nats.Msg, 16)
	_, err := b.nc.ChanSubscribe("harvest.wake.0.>", wakes)
	require.NoError(t, err)
	_, err = b.nc.ChanSubscribe("harvest.dispatch.0.>", dispatches)
	require.NoError(t, err)
	require.NoError(t, b.nc.Flush())

	st, err := b.client(t, secretA).Start(b.ctx, "echo", "orders.eu", nil, clientOpts("", ""))
	require.NoError(t, err)
	msg := receive(t, dispatches)
	require.Equal(t, "harvest.dispatch.0.orders%2Eeu", msg.Subject, "the queue is one encoded token")
	d := decode[dispatch.Dispatch](t, msg.Data)
	require.Equal(t, "orders.eu", d.Queue)
	var taskID int64
	require.NoError(t, b.dbs[0].QueryRow(b.ctx, `SELECT t.id FROM tasks t JOIN runs r ON r.pk = t.run_pk WHERE r.id = $1`, st.Run.ID).Scan(&taskID))
	require.Equal(t, taskID, d.TaskID)
	msg = receive(t, wakes)
	require.Equal(t, "harvest.wake.0.orders%2Eeu", msg.Subject)
	require.NotEmpty(t, msg.Header.Get("traceparent"), "the wake carries the start's trace")

	// The queue has a backlog now: the next start only wakes.
	_, err = b.client(t, secretA).Start(b.ctx, "echo", "orders.eu", nil, clientOpts("", ""))
	require.NoError(t, err)
	receive(t, wakes)
	select {
	case m := <-dispatches:
		t.Fatalf("unexpected dispatch %s", m.Data)
	default:
	}

	// A delayed run wakes nobody; its task waits in the scheduled state.
	_, err = b.client(t, secretA).Start(b.ctx, "echo", "later", nil, clientDelay(time.Hour))
	require.NoError(t, err)
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM tasks WHERE queue = 'later' AND state = 'scheduled'`))
}

func receive(t *testing.T, ch chan *nats.Msg) *nats.Msg {
	t.Helper()
	select {
	case m := <-ch:
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no message")
		return nil
	}
}

func TestKeyBinding(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{KeyBinding: true})
	c := b.client(t, secretA)
	st, err := c.Start(b.ctx, "echo", "shared", nil, clientOpts("", ""))
	require.NoError(t, err)
	require.Equal(t, tenantOn[0], st.Run.FairnessKey, "no key: the tenant's")
	st, err = c.Start(b.ctx, "echo", "shared", nil, clientOpts("", "vip"))
	require.NoError(t, err)
	require.Equal(t, tenantOn[0]+"/vip", st.Run.FairnessKey)
	status, out := b.natsCall(t, "harvest.start."+tenantOn[1], startBody(`"fairness_key":"`+tenantOn[0]+`/vip"`))
	require.Equal(t, 201, status)
	require.Equal(t, tenantOn[1]+"/"+tenantOn[0]+"/vip", decode[api.Run](t, out).FairnessKey, "no tenant can take another's key")
	_, err = c.Start(b.ctx, "echo", "shared", nil, clientOpts("", strings.Repeat("k", 256)))
	var ae *api.Error
	require.ErrorAs(t, err, &ae)
	require.Equal(t, "fairness_key", ae.Field)

	// Quota keys are bound too: no tenant can fill another's cap.
	status, out = b.natsCall(t, "harvest.start."+tenantOn[0], startBody(`"quota_key":"pool"`))
	require.Equal(t, 201, status, string(out))
	require.Equal(t, tenantOn[0]+"/pool", decode[api.Run](t, out).QuotaKey)
	status, out = b.natsCall(t, "harvest.start."+tenantOn[1], startBody(`"quota_key":"`+tenantOn[0]+`/pool"`))
	require.Equal(t, 201, status, string(out))
	require.Equal(t, tenantOn[1]+"/"+tenantOn[0]+"/pool", decode[api.Run](t, out).QuotaKey)
	status, out = b.natsCall(t, "harvest.start."+tenantOn[0], startBody(""))
	require.Equal(t, 201, status, string(out))
	require.Empty(t, decode[api.Run](t, out).QuotaKey, "no quota key stays none")
	status, out = b.natsCall(t, "harvest.start."+tenantOn[0], startBody(`"quota_key":"`+strings.Repeat("q", 255)+`"`))
	require.Equal(t, 400, status, string(out))
	require.Equal(t, "quota_key", apiErr(t, out).Field)
}

// A gateway started with key binding off says so at start; the default
// keeps it on.
func TestKeyBindingOffIsLogged(t *testing.T) {
	t.Parallel()
	require.True(t, DefaultConfig(nil, "").KeyBinding, "key binding is on by default")
	var logs strings.Builder
	cfg := DefaultConfig([]string{testsvc.NewDBURL(t)}, "")
	cfg.KeyBinding = false
	g, err := New(Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	g.Close()
	require.Contains(t, logs.String(), "key binding is off")
	logs.Reset()
	cfg.KeyBinding = true
	g, err = New(Options{Config: cfg, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, err)
	g.Close()
	require.NotContains(t, logs.String(), "key binding")
}

func TestAuthorizerHook(t *testing.T) {
	t.Parallel()
	var seen []StartAuthorization
	b := setup(t, setupOpts{Authorizer: AuthorizerFunc(func(_ context.Context, s StartAuthorization) error {
		seen = append(seen, s)
		switch s.Request.Name {
		case "forbidden":
			return errors.New("workflow forbidden is not allowed")
		case "limited":
			return &api.Error{Status: 429, Code: api.CodeOverLimit, Message: "slow down", RetryAfterMS: 1500}
		}
		return nil
	})})
	status, out := b.call(t, "POST", "/v1/runs", secretA, `{"name":"forbidden","queue":"shared"}`)
	require.Equal(t, 403, status)
	require.Contains(t, apiErr(t, out).Message, "not allowed")
	status, out = b.natsCall(t, "harvest.start."+tenantOn[0], `{"name":"limited","queue":"shared"}`)
	require.Equal(t, 429, status)
	require.Equal(t, int64(1500), apiErr(t, out).RetryAfterMS)
	b.nothingWritten(t, "refused by the authorizer")
	status, _ = b.call(t, "POST", "/v1/runs", secretA, `{"name":"fine","queue":"shared"}`)
	require.Equal(t, 201, status)
	require.Len(t, seen, 3)
	require.Equal(t, TransportHTTP, seen[0].Transport)
	require.Equal(t, "a-ci", seen[0].Principal)
	require.Equal(t, TransportNATS, seen[1].Transport)
	require.Equal(t, tenantOn[0], seen[1].Tenant)
	require.NotEmpty(t, seen[2].Request.ID, "the hook sees the final id")
}

type refuseOver struct{ limit int }

func (r refuseOver) Admit(_ context.Context, a tenantcap.Admission) error {
	if a.Running > r.limit {
		return &api.Error{Status: 429, Code: api.CodeOverLimit, Message: "over the limit", RetryAfterMS: 100}
	}
	return nil
}

func TestAdmitterHook(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{Admitter: refuseOver{limit: 2}})
	c := b.client(t, secretA)
	for i := range 2 {
		_, err := c.Start(b.ctx, "echo", "shared", nil, clientOpts(fmt.Sprint("r", i), ""))
		require.NoError(t, err)
	}
	status, out := b.call(t, "POST", "/v1/runs", secretA, `{"id":"r2","name":"echo","queue":"shared"}`)
	require.Equal(t, 429, status, string(out))
	require.Equal(t, api.CodeOverLimit, apiErr(t, out).Code)
	// A replay is never refused.
	st, err := c.Start(b.ctx, "echo", "shared", nil, clientOpts("r1", ""))
	require.NoError(t, err)
	require.False(t, st.Created)
	require.Equal(t, 2, b.count(t, 0, `SELECT count(*) FROM runs`))
	require.Equal(t, 2, b.count(t, 0, `SELECT count(*) FROM tasks`))
	require.Equal(t, 2, b.count(t, 0, `SELECT running FROM tenant_running`))
}

func TestTokens(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for _, c := range []struct {
		method, path, secret string
		status               int
	}{
		{"POST", "/v1/runs", "", 401},
		{"POST", "/v1/runs", "nope", 401},
		{"POST", "/v1/runs/batch", "", 401},
		{"GET", "/v1/runs", "", 401},
		{"GET", "/v1/runs/x", "nope", 401},
		{"POST", "/v1/runs/x/cancel", "", 401},
		{"POST", "/v1/runs", secretAReads, 403},
		{"POST", "/v1/runs/batch", secretAReads, 403},
		{"POST", "/v1/runs/x/cancel", secretAReads, 403},
		{"GET", "/v1/runs", secretAdmin, 403},
		{"GET", "/v1/runs/x", secretAReads, 404},
		{"GET", "/v1/runs", secretAReads, 200},
	} {
		status, out := b.call(t, c.method, c.path, c.secret, startBody(""))
		require.Equal(t, c.status, status, "%s %s with %q: %s", c.method, c.path, c.secret, out)
		if status >= 400 {
			require.Equal(t, c.status, apiErr(t, out).Status)
		}
	}
	b.nothingWritten(t, "refused calls")

	// A new token set is in force at once (the store's Watch does this
	// when the file changes).
	status, _ := b.call(t, "POST", "/v1/runs", "rotated", startBody(""))
	require.Equal(t, 401, status)
	set, err := auth.ParseTokens([]byte(`[{"name":"new","sha256":"` + auth.HashSecret("rotated") + `","tenant":"` + tenantOn[0] + `","privileges":["runs:start"]}]`))
	require.NoError(t, err)
	b.tokens.Replace(set)
	status, _ = b.call(t, "POST", "/v1/runs", "rotated", startBody(""))
	require.Equal(t, 201, status)
	status, _ = b.call(t, "POST", "/v1/runs", secretA, startBody(""))
	require.Equal(t, 401, status, "the old token is gone")
}

func TestUnknownRouteAndMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	status, out := b.call(t, "GET", "/v2/nothing", secretA, nil)
	require.Equal(t, 404, status)
	require.Equal(t, api.CodeNotFound, apiErr(t, out).Code)
	status, out = b.call(t, "GET", "/metrics", "", nil)
	require.Equal(t, 200, status)
	require.Contains(t, string(out), "metrics")
	status, _ = b.call(t, "GET", "/readyz", "", nil)
	require.Equal(t, 200, status)
}

var _ = runstore.ErrConflict

// Bytes that are not UTF-8 are refused naming the field, not replaced with
// U+FFFD and taken; so are control and bidirectional-override characters
// in queue names and keys, which the admin page and the CLI print.
func TestStartRefusesBadText(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for _, tc := range []struct{ body, field string }{
		{"{\"name\":\"ec\xffho\",\"queue\":\"shared\"}", "name"},
		{"{\"name\":\"echo\",\"queue\":\"sh\xc3\"}", "queue"},
		{"{\"name\":\"echo\",\"queue\":\"shared\",\"fairness_key\":\"k\xfe\"}", "fairness_key"},
		{"{\"name\":\"echo\",\"queue\":\"shared\",\"input\":{\"a\":\"\xff\"}}", "input"},
		{`{"name":"echo","queue":"sha\u202Ered"}`, "queue"},
		{`{"name":"echo","queue":"sha\u0007red"}`, "queue"},
		{`{"name":"echo","queue":"shared","fairness_key":"a\u2066b"}`, "fairness_key"},
		{`{"name":"echo","queue":"shared","quota_key":"a\u200Fb"}`, "quota_key"},
	} {
		status, out := b.call(t, "POST", "/v1/runs", secretA, tc.body)
		require.Equal(t, 400, status, "%q: %s", tc.body, out)
		require.Equal(t, tc.field, apiErr(t, out).Field, "%q", tc.body)
		status, out = b.call(t, "POST", "/v1/runs/batch", secretA, `{"runs":[`+tc.body+`]}`)
		require.Equal(t, 200, status, string(out))
		require.Contains(t, string(out), `"field":"`+tc.field+`"`, "%q", tc.body)
	}
	b.nothingWritten(t, "bad text")
	status, out := b.call(t, "PUT", "/v1/queues/shared/weights/a%E2%80%AEb", secretRoot, `{"weight": 2}`)
	require.Equal(t, 400, status, string(out))
	require.Equal(t, "key", apiErr(t, out).Field)
}

// A run that is not due yet holds an admission slot, so a start may not be
// scheduled further ahead than HARVEST_GATEWAY_MAX_SCHEDULE_AHEAD (30 days
// by default).
func TestStartScheduledTooFarAheadIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	require.Equal(t, 30*24*time.Hour, DefaultConfig(nil, "").MaxScheduleAhead)
	for _, tc := range []struct{ extra, field string }{
		{`"delay":"1000000h"`, "delay"},
		{`"delay":"721h"`, "delay"},
		{`"run_at":"9999-12-31T00:00:00Z"`, "run_at"},
		{`"run_at":"` + time.Now().Add(31*24*time.Hour).UTC().Format(time.RFC3339) + `"`, "run_at"},
	} {
		status, out := b.call(t, "POST", "/v1/runs", secretA, startBody(tc.extra))
		require.Equal(t, 400, status, "%s: %s", tc.extra, out)
		require.Equal(t, tc.field, apiErr(t, out).Field)
		require.Contains(t, apiErr(t, out).Message, "HARVEST_GATEWAY_MAX_SCHEDULE_AHEAD")
		status, out = b.natsCall(t, "harvest.start."+tenantOn[0], startBody(tc.extra))
		require.Equal(t, 400, status, "%s: %s", tc.extra, out)
	}
	b.nothingWritten(t, "scheduled too far ahead")
	for _, extra := range []string{`"delay":"719h"`, `"run_at":"` + time.Now().Add(29*24*time.Hour).UTC().Format(time.RFC3339) + `"`} {
		status, out := b.call(t, "POST", "/v1/runs", secretA, startBody(extra))
		require.Equal(t, 201, status, "%s: %s", extra, out)
	}
}
