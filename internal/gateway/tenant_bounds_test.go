package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/tenantcap"
)

// A tenant's start may carry at most its priority ceiling: the default
// priority unless an operator raised it. Over HTTP and NATS alike, above
// the ceiling is 403 naming the field and the ceiling, and nothing is
// written; at or below it the tenant orders its own runs freely.
func TestPriorityCeilingRefusesAboveIt(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	a := tenantOn[0]

	for _, p := range []int{1, 1000} {
		status, body := b.call(t, "POST", "/v1/runs", secretA, startBody(fmt.Sprintf(`"priority":%d`, p)))
		require.Equal(t, http.StatusForbidden, status, string(body))
		e := apiErr(t, body)
		require.Equal(t, api.CodePermissionDenied, e.Code)
		require.Equal(t, "priority", e.Field)
		require.Contains(t, e.Message, "above 0")
	}
	status, body := b.natsCall(t, "harvest.start."+a, startBody(`"priority":5`))
	require.Equal(t, http.StatusForbidden, status, string(body))
	require.Equal(t, "priority", apiErr(t, body).Field)
	// A batch refuses the item alone.
	status, body = b.call(t, "POST", "/v1/runs/batch", secretA,
		`{"runs":[`+startBody(`"priority":9`)+`,`+startBody(`"priority":-3`)+`]}`)
	require.Equal(t, http.StatusOK, status, string(body))
	res := decode[api.BatchStartResponse](t, body)
	require.NotNil(t, res.Results[0].Error)
	require.Equal(t, "priority", res.Results[0].Error.Field)
	require.NotNil(t, res.Results[1].Run)
	require.Equal(t, -3, res.Results[1].Run.Priority)

	for _, p := range []int{0, -1000} {
		status, body := b.call(t, "POST", "/v1/runs", secretA, startBody(fmt.Sprintf(`"priority":%d`, p)))
		require.Equal(t, http.StatusCreated, status, string(body))
	}
	require.Equal(t, 3, b.count(t, b.gw.home(a), `SELECT count(*) FROM runs WHERE tenant = $1`, a))
}

// An operator raises one tenant's ceiling through the API; the tenant's
// starts up to it are admitted, above it refused, and the other tenant
// keeps the default. The change is audited, shows in GET /v1/admission
// and /v1/usage, reaches a second gateway over NATS, and a tenant token
// cannot make it. Clearing it puts the tenant back to the default.
func TestPriorityCeilingSetByOperator(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{Reload: time.Hour})
	other := setup(t, setupOpts{Shards: b.urls, NATSURL: b.natsURL, Reload: time.Hour})
	a, bt := tenantOn[0], tenantOn[1]

	// A tenant token has no config privilege: refused and audited.
	status, body := b.call(t, "PUT", "/v1/tenants/"+a+"/priority", secretAOps, `{"max_priority":1000}`)
	require.Equal(t, http.StatusForbidden, status, string(body))
	// Bad input names the field.
	status, body = b.call(t, "PUT", "/v1/tenants/"+a+"/priority", secretRoot, `{"max_priority":1001}`)
	require.Equal(t, http.StatusBadRequest, status, string(body))
	require.Equal(t, "max_priority", apiErr(t, body).Field)
	status, body = b.call(t, "PUT", "/v1/tenants/no.such/priority", secretRoot, `{"max_priority":1}`)
	require.Equal(t, http.StatusBadRequest, status, string(body))
	require.Equal(t, "tenant", apiErr(t, body).Field)
	status, body = b.call(t, "PUT", "/v1/tenants/"+a+"/priority", secretRoot, `{"max":1}`)
	require.Equal(t, http.StatusBadRequest, status, string(body))

	status, body = b.call(t, "PUT", "/v1/tenants/"+a+"/priority", secretRoot, `{"max_priority":100}`)
	require.Equal(t, http.StatusOK, status, string(body))
	got := decode[api.PriorityCeiling](t, body)
	require.Equal(t, api.PriorityCeiling{Tenant: a, MaxPriority: 100, UpdatedAt: got.UpdatedAt, UpdatedBy: "root"}, got)

	// The other gateway heard of it over NATS (its periodic reload is an
	// hour away).
	require.Eventually(t, func() bool { return other.gw.adm.watcher.Ceilings().MaxPriority(a) == 100 },
		10*time.Second, 10*time.Millisecond)
	for _, gw := range []*bundle{b, other} {
		status, body = gw.call(t, "POST", "/v1/runs", secretA, startBody(`"priority":100`))
		require.Equal(t, http.StatusCreated, status, string(body))
		status, body = gw.call(t, "POST", "/v1/runs", secretA, startBody(`"priority":101`))
		require.Equal(t, http.StatusForbidden, status, string(body))
		require.Contains(t, apiErr(t, body).Message, "above 100")
		status, body = gw.call(t, "POST", "/v1/runs", secretB, startBody(`"priority":1`))
		require.Equal(t, http.StatusForbidden, status, string(body), "the other tenant keeps the default")
	}

	status, body = b.call(t, "GET", "/v1/tenants/"+a+"/priority", secretAdmin, nil)
	require.Equal(t, http.StatusOK, status, string(body))
	require.Equal(t, 100, decode[api.PriorityCeiling](t, body).MaxPriority)
	status, body = b.call(t, "GET", "/v1/tenants/"+bt+"/priority", secretAdmin, nil)
	require.Equal(t, http.StatusOK, status, string(body))
	require.Equal(t, api.PriorityCeiling{Tenant: bt, MaxPriority: 0, Default: true}, decode[api.PriorityCeiling](t, body))
	status, body = b.call(t, "GET", "/v1/admission", secretAdmin, nil)
	require.Equal(t, http.StatusOK, status, string(body))
	view := decode[api.AdmissionView](t, body)
	require.Len(t, view.PriorityCeilings, 1)
	require.Equal(t, a, view.PriorityCeilings[0].Tenant)
	status, body = b.call(t, "GET", "/v1/usage", secretA, nil)
	require.Equal(t, http.StatusOK, status, string(body))
	require.Equal(t, 100, decode[api.UsageView](t, body).MaxPriority)

	// Audited: the change with its old and new value, and the refusals.
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM audit WHERE action = $1 AND outcome = 'ok'
		AND old_value->>'default' = 'true' AND new_value->>'max_priority' = '100' AND actor = 'root'`, tenantcap.PriorityAction))
	for _, actor := range []string{"a-ops", "root"} {
		require.Positive(t, b.count(t, 0, `SELECT count(*) FROM audit WHERE action = $1 AND outcome = 'refused' AND actor = $2`,
			tenantcap.PriorityAction, actor), actor)
	}

	status, body = b.call(t, "DELETE", "/v1/tenants/"+a+"/priority", secretRoot, nil)
	require.Equal(t, http.StatusOK, status, string(body))
	require.True(t, decode[api.PriorityCeiling](t, body).Default)
	require.Eventually(t, func() bool { return other.gw.adm.watcher.Ceilings().MaxPriority(a) == 0 },
		10*time.Second, 10*time.Millisecond)
	status, body = other.call(t, "POST", "/v1/runs", secretA, startBody(`"priority":1`))
	require.Equal(t, http.StatusForbidden, status, string(body))
}

// setScheduledShare sets the admission configuration's scheduled share
// through the API.
func (b *bundle) setAdmission(t *testing.T, body string) {
	t.Helper()
	status, out := b.call(t, "PUT", "/v1/admission", secretRoot, body)
	require.Equal(t, http.StatusOK, status, string(out))
}

// Runs not due yet count against the limits like any unfinished run, but
// a tenant may hold only scheduled_share of its budget that way: a tenant
// that starts max_runs runs a month ahead cannot lock the others out.
// With max_runs 8 under no_limit and the default quarter, two may wait.
func TestScheduledRunsHeldToAShare(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{MaxRuns: 8})

	for i := range 2 {
		status, body := b.call(t, "POST", "/v1/runs", secretA, startBody(`"delay":"719h"`))
		require.Equal(t, http.StatusCreated, status, "scheduled start %d: %s", i, body)
	}
	status, body := b.call(t, "POST", "/v1/runs", secretA, startBody(`"delay":"719h"`))
	require.Equal(t, http.StatusTooManyRequests, status, string(body))
	e := apiErr(t, body)
	require.Equal(t, api.CodeOverLimit, e.Code)
	require.Contains(t, e.Message, "not due yet")
	// A run_at ahead counts the same, and a batch judges its items one
	// after the other.
	at := time.Now().Add(48 * time.Hour).UTC().Format(time.RFC3339)
	status, body = b.call(t, "POST", "/v1/runs/batch", secretA,
		`{"runs":[`+startBody(`"run_at":"`+at+`"`)+`,`+startBody(``)+`]}`)
	require.Equal(t, http.StatusOK, status, string(body))
	res := decode[api.BatchStartResponse](t, body)
	require.NotNil(t, res.Results[0].Error, "the third run not due yet")
	require.Equal(t, api.CodeOverLimit, res.Results[0].Error.Code)
	require.NotNil(t, res.Results[1].Run, "a run due now is admitted")

	// The other tenant, and the same tenant's due runs, still get in up
	// to max_runs: the tenant holds 3 of 8.
	for i := range 5 {
		secret := secretB
		if i == 0 {
			secret = secretA
		}
		status, body := b.call(t, "POST", "/v1/runs", secret, startBody(``))
		require.Equal(t, http.StatusCreated, status, "due start %d: %s", i, body)
	}
	status, body = b.call(t, "POST", "/v1/runs", secretB, startBody(``))
	require.Equal(t, http.StatusTooManyRequests, status, "max_runs still holds: %s", body)

	// Raising the share lets the tenant wait with more.
	b.setAdmission(t, `{"scheduled_share": 0.5}`)
	status, body = b.call(t, "GET", "/v1/usage", secretA, nil)
	require.Equal(t, http.StatusOK, status, string(body))
	require.Equal(t, 4, decode[api.UsageView](t, body).ScheduledCap)
	status, body = b.call(t, "PUT", "/v1/admission", secretRoot, `{"scheduled_share": 0}`)
	require.Equal(t, http.StatusBadRequest, status, string(body))
	require.Equal(t, "scheduled_share", apiErr(t, body).Field)
}

// Starts not due yet of one tenant racing through two gateways are
// admitted exactly up to the tenant's scheduled cap, and a cancelled one
// frees its place.
func TestScheduledCapExactAcrossGateways(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{MaxRuns: 40})
	other := setup(t, setupOpts{Shards: b.urls, NATSURL: b.natsURL, MaxRuns: 40})
	a := tenantOn[0]
	const cap, tries = 10, 40 // a quarter of 40

	var mu sync.Mutex
	admitted, refused := 0, 0
	var wg sync.WaitGroup
	for i := range tries {
		gw := b
		if i%2 == 1 {
			gw = other
		}
		wg.Go(func() {
			status, body := gw.call(t, "POST", "/v1/runs", secretA, startBody(`"delay":"1h"`))
			mu.Lock()
			defer mu.Unlock()
			switch status {
			case http.StatusCreated:
				admitted++
			case http.StatusTooManyRequests:
				refused++
			default:
				t.Errorf("start: %d %s", status, body)
			}
		})
	}
	wg.Wait()
	require.Equal(t, cap, admitted)
	require.Equal(t, tries-cap, refused)
	require.Equal(t, cap, b.count(t, b.gw.home(a), `SELECT count(*) FROM runs WHERE tenant = $1 AND not_before > now()`, a))

	var id string
	require.NoError(t, b.dbs[b.gw.home(a)].QueryRow(b.ctx, `SELECT id FROM runs WHERE tenant = $1 LIMIT 1`, a).Scan(&id))
	status, body := b.call(t, "POST", "/v1/runs/"+id+"/cancel", secretA, nil)
	require.Equal(t, http.StatusOK, status, string(body))
	status, body = other.call(t, "POST", "/v1/runs", secretA, startBody(`"delay":"1h"`))
	require.Equal(t, http.StatusCreated, status, string(body))
	status, body = b.call(t, "POST", "/v1/runs", secretA, startBody(`"delay":"1h"`))
	require.Equal(t, http.StatusTooManyRequests, status, string(body))
	var usage api.UsageView
	status, body = b.call(t, "GET", "/v1/usage", secretA, nil)
	require.Equal(t, http.StatusOK, status)
	require.NoError(t, json.Unmarshal(body, &usage))
	require.Equal(t, cap, usage.Running, "only the runs not due yet are unfinished")
}

// A deferred start's waiting run (debounce window, batch, throttle
// backlog) is not due either: it counts toward the same scheduled cap, so
// a tenant cannot hold max_runs for a week in windows on many keys. A join
// of an open window adds no run and is not held to it.
func TestDeferredRunsCountAsScheduled(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{MaxRuns: 8})
	b.startRun(t, secretA, http.StatusCreated, deferredBody("sched", `"debounce":{"key":"k1","period":"1h"}`))
	b.startRun(t, secretA, http.StatusCreated, startBody(`"delay":"1h"`))
	status, body := b.call(t, "POST", "/v1/runs", secretA, deferredBody("sched", `"debounce":{"key":"k2","period":"1h"}`))
	require.Equal(t, http.StatusTooManyRequests, status, string(body))
	require.Contains(t, apiErr(t, body).Message, "not due yet")
	status, body = b.call(t, "POST", "/v1/runs", secretA, deferredBody("sched", `"throttle":{"key":"t","limit":1,"period":"1h"}`))
	require.Equal(t, http.StatusCreated, status, "a throttled start under its limit runs now: %s", body)
	status, body = b.call(t, "POST", "/v1/runs", secretA, deferredBody("sched", `"throttle":{"key":"t","limit":1,"period":"1h"}`))
	require.Equal(t, http.StatusTooManyRequests, status, "one that must wait is held: %s", body)
	b.startRun(t, secretA, http.StatusCreated, deferredBody("sched", `"debounce":{"key":"k1","period":"1h"}`))
}
