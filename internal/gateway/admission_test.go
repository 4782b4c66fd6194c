package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
)

// eightTenants is the spec's setting: 8 registered tenants (tenantOn[0]
// with secretA, tenantOn[1] with secretB, six more) and the root and ops
// administrators, who are not tenants.
func eightTenants(t *testing.T) *auth.TokenSet {
	t.Helper()
	entries := []string{
		entry("a-ci", secretA, tenantOn[0], "runs:start", "runs:read"),
		entry("b-ci", secretB, tenantOn[1], "runs:start", "runs:read"),
		entry("ops", secretAdmin, "", "runs:read", "config:read"),
		entry("root", secretRoot, "", "weights:read", "weights:write", "config:read", "config:write"),
	}
	for i := 2; i < 8; i++ {
		entries = append(entries, entry(fmt.Sprint("t", i, "-ci"), fmt.Sprint("secret-t", i), fmt.Sprint("t", i), "runs:start"))
	}
	set, err := auth.ParseTokens([]byte("[" + strings.Join(entries, ",") + "]"))
	require.NoError(t, err)
	require.Len(t, set.Tenants(), 8)
	return set
}

// fillRuns starts n runs of tenant over NATS (batch) and requires them all
// admitted.
func fillRuns(t *testing.T, b *bundle, tenant string, n int) {
	t.Helper()
	reqs := make([]api.StartRequest, n)
	for i := range reqs {
		reqs[i] = api.StartRequest{Name: "echo", Queue: "shared"}
	}
	res, err := b.natsClient(t, tenant).StartBatch(b.ctx, reqs)
	require.NoError(t, err)
	for _, r := range res {
		require.Nil(t, r.Error, "fill %s: %v", tenant, r.Error)
	}
}

// putAdmission sends PUT /v1/admission as root and returns the view.
func putAdmission(t *testing.T, b *bundle, body string) api.AdmissionView {
	t.Helper()
	status, out := b.call(t, "PUT", "/v1/admission", secretRoot, body)
	require.Equal(t, 200, status, string(out))
	return decode[api.AdmissionView](t, out)
}

// fresh waits until the gateway's cached totals hold total runs.
func fresh(t *testing.T, b *bundle, total int) {
	t.Helper()
	require.Eventually(t, func() bool { return b.gw.adm.totals.Sum() == total }, 30*time.Second, 5*time.Millisecond)
}

func runsOf(t *testing.T, b *bundle, tenant string) int {
	t.Helper()
	return b.count(t, b.gw.home(tenant), `SELECT count(*) FROM runs WHERE tenant = $1 AND finished_at IS NULL`, tenant)
}

// The spec's static example: 128 max runs, 8 tenants, TFM 1: 16 each. The
// 17th start gets 429 over HTTP (Retry-After, a message naming the
// algorithm, the limit and the count), over NATS (retry_after_ms), and
// each item of a batch is decided on its own; refused starts leave
// nothing behind.
func TestAdmissionStaticExample(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{Tokens: eightTenants(t)})
	v := putAdmission(t, b, `{"algorithm": "static", "tfm": 1}`)
	require.Equal(t, api.AlgorithmStatic, v.Algorithm)
	require.Equal(t, 128, v.MaxRuns)
	require.True(t, v.MaxRunsReadOnly)
	require.Equal(t, 8, v.Tenants)
	require.NotNil(t, v.Limit)
	require.Equal(t, 16, *v.Limit)

	fillRuns(t, b, tenantOn[0], 10)
	items := make([]string, 10)
	for i := range items {
		items[i] = fmt.Sprintf(`{"id": "b%d", "name": "echo", "queue": "shared"}`, i)
	}
	status, out := b.call(t, "POST", "/v1/runs/batch", secretA, `{"runs": [`+strings.Join(items, ",")+`]}`)
	require.Equal(t, 200, status, string(out))
	batch := decode[api.BatchStartResponse](t, out)
	admitted := 0
	for _, r := range batch.Results {
		if r.Error == nil {
			admitted++
			continue
		}
		require.Equal(t, api.CodeOverLimit, r.Error.Code)
		require.Equal(t, 429, r.Error.Status)
		require.Positive(t, r.Error.RetryAfterMS)
	}
	require.Equal(t, 6, admitted, "each item decided on its own: 10 + 6 = 16")
	require.Equal(t, 6, b.count(t, 0, `SELECT count(*) FROM runs WHERE id LIKE 'b%'`))

	req, err := http.NewRequest("POST", b.srv.URL+"/v1/runs", strings.NewReader(startBody(`"id": "over"`)))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+secretA)
	resp, err := b.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 429, resp.StatusCode)
	require.Equal(t, "1", resp.Header.Get("Retry-After"), "seconds, rounded up")
	var eb api.ErrorBody
	require.NoError(t, decodeJSON(resp, &eb))
	require.Equal(t, api.CodeOverLimit, eb.Error.Code)
	require.Equal(t, int64(1000), eb.Error.RetryAfterMS)
	for _, s := range []string{"static", "limit is 16", "holds 16", tenantOn[0]} {
		require.Contains(t, eb.Error.Message, s)
	}

	status, out = b.natsCall(t, "harvest.start."+tenantOn[0], startBody(`"id": "over-nats"`))
	require.Equal(t, 429, status)
	e := apiErr(t, out)
	require.Equal(t, int64(1000), e.RetryAfterMS)
	require.Contains(t, e.Message, "static")

	// Nothing left behind by the refusals.
	require.Equal(t, 16, runsOf(t, b, tenantOn[0]))
	require.Equal(t, 16, b.count(t, 0, `SELECT running FROM tenant_running WHERE tenant = $1`, tenantOn[0]))
	require.Zero(t, b.count(t, 0, `SELECT count(*) FROM runs WHERE id IN ('over', 'over-nats')`))
	require.Equal(t, 16, b.count(t, 0, `SELECT count(*) FROM tasks t JOIN runs r ON r.pk = t.run_pk WHERE r.tenant = $1`, tenantOn[0]))

	// Decisions are counted by outcome, without a tenant attribute.
	decisions := admissionDecisions(t)
	require.GreaterOrEqual(t, decisions["refused_tenant_limit"], int64(6))
	require.GreaterOrEqual(t, decisions["admitted"], int64(16))

	// The tenant sees its own figures; another tenant still gets in.
	u, err := b.client(t, secretA).Usage(b.ctx)
	require.NoError(t, err)
	require.Equal(t, tenantOn[0], u.Tenant)
	require.Equal(t, 16, u.Running)
	require.Equal(t, 16, *u.Limit)
	require.Equal(t, api.AlgorithmStatic, u.Algorithm)
	_, err = b.client(t, secretB).Start(b.ctx, "echo", "shared", nil, client.StartOptions{})
	require.NoError(t, err)

	// A cancelled run frees its place at once.
	var done string
	require.NoError(t, b.dbs[0].QueryRow(b.ctx, `SELECT id FROM runs WHERE id LIKE 'b%' LIMIT 1`).Scan(&done))
	_, err = b.client(t, secretA).Cancel(b.ctx, done)
	require.NoError(t, err)
	_, err = b.client(t, secretA).Start(b.ctx, "echo", "shared", nil, client.StartOptions{ID: "after-cancel"})
	require.NoError(t, err)
}

func decodeJSON(resp *http.Response, v any) error {
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, v)
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// The system limit refuses even under no_limit, and says so.
func TestAdmissionSystemLimit(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{MaxRuns: 3})
	fillRuns(t, b, tenantOn[0], 2)
	fillRuns(t, b, tenantOn[1], 1)
	fresh(t, b, 3)
	status, out := b.call(t, "POST", "/v1/runs", secretA, startBody(""))
	require.Equal(t, 429, status, string(out))
	e := apiErr(t, out)
	require.Contains(t, e.Message, "max_runs=3")
	require.Contains(t, e.Message, "read-only maximum")
	require.Contains(t, e.Message, "no_limit")
	require.Equal(t, 2, runsOf(t, b, tenantOn[0]))
}

// The system limit holds across shards even when each gateway's cached
// view of the other shard is stale (no refresh during the test): the
// shards' capacity leases add up to max_runs at most, so once shard 0
// holds all of it, shard 1 admits nothing (before leases, gateway b
// admitted another 10 here); capacity freed on shard 0 is taken back for
// shard 1, exactly as much as was freed.
func TestAdmissionExactAcrossShardsWithStaleViews(t *testing.T) {
	t.Parallel()
	a := setup(t, setupOpts{MaxRuns: 10, Refresh: time.Hour})
	b := setup(t, setupOpts{MaxRuns: 10, Refresh: time.Hour, Shards: a.urls, NATSURL: a.natsURL})
	startAll := func(g *bundle, secret, prefix string) (admitted int) {
		for i := range 12 {
			status, out := g.call(t, "POST", "/v1/runs", secret, startBody(fmt.Sprintf(`"id": "%s%d"`, prefix, i)))
			switch status {
			case 201:
				admitted++
			case 429:
				require.Contains(t, apiErr(t, out).Message, "max_runs=10")
			default:
				t.Fatalf("%d: %s", status, out)
			}
		}
		return admitted
	}
	// Wait for each gateway's first read of the totals (the next is an hour
	// away).
	for _, g := range []*bundle{a, b} {
		require.Eventually(t, func() bool {
			for _, s := range g.gw.adm.totals.Snapshot() {
				if s.ReadAt.IsZero() {
					return false
				}
			}
			return true
		}, 30*time.Second, 5*time.Millisecond)
	}
	// tenantOn[0] lives on shard 0 (through gateway a), tenantOn[1] on
	// shard 1 (through gateway b).
	require.Equal(t, 10, startAll(a, secretA, "a"), "shard 0 alone: exact")
	require.Zero(t, startAll(b, secretB, "b"), "shard 0 holds all the capacity, whatever b's view")
	require.Equal(t, 10, runsOf(t, a, tenantOn[0])+runsOf(t, a, tenantOn[1]))

	for _, id := range []string{"a0", "a1", "a2"} {
		status, out := a.call(t, "POST", "/v1/runs/"+id+"/cancel", secretA, nil)
		require.Equal(t, 200, status, string(out))
	}
	require.Equal(t, 3, startAll(b, secretB, "b2-"), "the capacity the cancels freed moves to shard 1")
	require.Zero(t, startAll(a, secretA, "a2-"))
	require.Equal(t, 7, runsOf(t, a, tenantOn[0]))
	require.Equal(t, 3, runsOf(t, a, tenantOn[1]))
	ledger, err := a.gw.adm.leases.Ledger(a.ctx)
	require.NoError(t, err)
	require.LessOrEqual(t, ledger[0]+ledger[1], 10, "the ledger never holds more than max_runs: %v", ledger)
}

// The spec's dynamic examples with two gateways (TFM 3, max 128): at 32 in
// flight both the tenant with 29 and the one with 1 get in; at 120 in
// flight the limit is 24: the tenant with 29 gets 429, the one with 1 gets
// in.
func TestAdmissionDynamicExamples(t *testing.T) {
	t.Parallel()
	tokens := eightTenants(t)
	a := setup(t, setupOpts{Tokens: tokens})
	b := setup(t, setupOpts{Tokens: tokens, Shards: a.urls, NATSURL: a.natsURL})
	heavy, light, filler := tenantOn[0], tenantOn[1], "t2"
	fillRuns(t, a, heavy, 29)
	fillRuns(t, a, light, 1)
	fillRuns(t, a, filler, 2)
	v := putAdmission(t, a, `{"algorithm": "dynamic", "tfm": 3}`)
	require.Equal(t, api.AlgorithmDynamic, v.Algorithm)
	require.Equal(t, 32, v.RunningTotal)
	// TFM × (max_runs − in flight) = 3 × 96. (The spec writes 384 for this
	// example; its own formula gives 288. Either way both tenants get in.)
	require.Equal(t, 288, *v.Limit)
	fresh(t, a, 32)
	fresh(t, b, 32)
	require.Eventually(t, func() bool { return b.gw.adm.watcher.Config().Algorithm == api.AlgorithmDynamic }, 30*time.Second, 5*time.Millisecond)
	hs, err := b.client(t, secretA).Start(b.ctx, "echo", "shared", nil, client.StartOptions{ID: "heavy-32"})
	require.NoError(t, err, "29 < 288")
	ls, err := a.client(t, secretB).Start(a.ctx, "echo", "shared", nil, client.StartOptions{ID: "light-32"})
	require.NoError(t, err, "1 < 288")
	_, err = a.client(t, secretA).Cancel(a.ctx, hs.Run.ID)
	require.NoError(t, err)
	_, err = b.client(t, secretB).Cancel(b.ctx, ls.Run.ID)
	require.NoError(t, err)

	// The filler tenant would be refused under dynamic itself: fill under
	// no_limit, then switch back.
	putAdmission(t, a, `{"algorithm": "no_limit"}`)
	require.Eventually(t, func() bool { return b.gw.adm.watcher.Config().Algorithm == api.AlgorithmNoLimit }, 30*time.Second, 5*time.Millisecond)
	fillRuns(t, a, filler, 88)
	putAdmission(t, a, `{"algorithm": "dynamic"}`)
	require.Eventually(t, func() bool { return b.gw.adm.watcher.Config().Algorithm == api.AlgorithmDynamic }, 30*time.Second, 5*time.Millisecond)
	fresh(t, a, 120)
	fresh(t, b, 120)
	for _, g := range []*bundle{a, b} {
		u, err := g.client(t, secretA).Usage(g.ctx)
		require.NoError(t, err)
		require.Equal(t, 29, u.Running)
		require.Equal(t, 24, *u.Limit, "3 × (128 − 120)")
	}
	status, out := b.call(t, "POST", "/v1/runs", secretA, startBody(`"id": "heavy-120"`))
	require.Equal(t, 429, status, string(out))
	e := apiErr(t, out)
	for _, s := range []string{"dynamic", "limit is 24", "holds 29", "120 of max_runs=128"} {
		require.Contains(t, e.Message, s)
	}
	status, out = a.call(t, "POST", "/v1/runs", secretB, startBody(`"id": "light-120"`))
	require.Equal(t, 201, status, string(out))
	require.Equal(t, 29, runsOf(t, a, heavy))
	require.Equal(t, 2, runsOf(t, a, light))
}

// Two gateways, one tenant 6 runs below its limit of 16, 50 concurrent
// clients over both gateways' HTTP and NATS: exactly 6 get in.
func TestAdmissionExactPerTenantRace(t *testing.T) {
	t.Parallel()
	tokens := eightTenants(t)
	a := setup(t, setupOpts{Tokens: tokens})
	b := setup(t, setupOpts{Tokens: tokens, Shards: a.urls, NATSURL: a.natsURL})
	putAdmission(t, a, `{"algorithm": "static", "tfm": 1}`)
	require.Eventually(t, func() bool { return b.gw.adm.watcher.Config().Algorithm == api.AlgorithmStatic }, 30*time.Second, 5*time.Millisecond)
	fillRuns(t, a, tenantOn[0], 10)

	clients := []*client.Client{a.client(t, secretA), b.client(t, secretA), a.natsClient(t, tenantOn[0]), b.natsClient(t, tenantOn[0])}
	var mu sync.Mutex
	admitted, refused := 0, 0
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 50 {
		wg.Go(func() {
			<-start
			_, err := clients[i%len(clients)].Start(context.Background(), "echo", "shared", nil, client.StartOptions{ID: fmt.Sprint("race-", i)})
			mu.Lock()
			defer mu.Unlock()
			if err == nil {
				admitted++
				return
			}
			var ae *api.Error
			if errors.As(err, &ae) && ae.Code == api.CodeOverLimit {
				refused++
			}
		})
	}
	close(start)
	wg.Wait()
	require.Equal(t, 6, admitted)
	require.Equal(t, 44, refused)
	require.Equal(t, 16, runsOf(t, a, tenantOn[0]))
	require.Equal(t, 16, a.count(t, 0, `SELECT running FROM tenant_running WHERE tenant = $1`, tenantOn[0]))
}

// A change made on gateway A applies at gateway B's next start (announced
// over NATS, well before the periodic reload), survives a restart (a new
// gateway loads it from shard 0) and is audited with the token's name.
func TestAdmissionChangePropagates(t *testing.T) {
	t.Parallel()
	tokens := eightTenants(t)
	a := setup(t, setupOpts{Tokens: tokens})
	// B reloads only once an hour: the change can reach it in time only as
	// the NATS announcement.
	b := setup(t, setupOpts{Tokens: tokens, Shards: a.urls, NATSURL: a.natsURL, Reload: time.Hour})
	fillRuns(t, a, tenantOn[0], 3)
	status, out := b.call(t, "POST", "/v1/runs", secretA, startBody(`"id": "before"`))
	require.Equal(t, 201, status, string(out))

	v := putAdmission(t, a, `{"algorithm": "static", "tfm": 0.125}`)
	require.Equal(t, 2, *v.Limit, "floor(128 × 0.125 / 8)")
	require.Equal(t, "root", v.UpdatedBy)
	require.Eventually(t, func() bool { return b.gw.adm.watcher.Config().Algorithm == api.AlgorithmStatic }, 30*time.Second, 2*time.Millisecond, "announced over NATS")
	status, out = b.call(t, "POST", "/v1/runs", secretA, startBody(`"id": "after"`))
	require.Equal(t, 429, status, string(out))
	require.Contains(t, apiErr(t, out).Message, "static (tfm 0.125)")

	// A gateway started now loads it from shard 0.
	c := setup(t, setupOpts{Tokens: tokens, Shards: a.urls, NATSURL: a.natsURL})
	status, out = c.call(t, "GET", "/v1/admission", secretAdmin, nil)
	require.Equal(t, 200, status, string(out))
	cv := decode[api.AdmissionView](t, out)
	require.Equal(t, api.AlgorithmStatic, cv.Algorithm)
	require.Equal(t, 0.125, cv.TFM)
	require.Equal(t, 4, cv.Running[tenantOn[0]])
	require.Equal(t, 8, len(cv.Running), "every registered tenant is listed")

	require.Equal(t, 1, a.count(t, 0, `SELECT count(*) FROM audit WHERE action = 'admission.set' AND actor = 'root' AND outcome = 'ok'`))
}

// config:read and config:write are checked (401, 403); refusals of PUT are
// audited with the token's name; bad values are 400 naming the field.
func TestAdmissionRoutesPrivileges(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{})
	for _, tc := range []struct {
		method, path, secret, body string
		status                     int
		field                      string
	}{
		{"GET", "/v1/admission", "", "", 401, ""},
		{"GET", "/v1/admission", "nope", "", 401, ""},
		{"GET", "/v1/admission", secretA, "", 403, ""},
		{"GET", "/v1/admission", secretWRead, "", 403, ""},
		{"PUT", "/v1/admission", secretA, `{"algorithm": "dynamic"}`, 403, ""},
		{"PUT", "/v1/admission", secretAdmin, `{"algorithm": "dynamic"}`, 403, ""},
		{"PUT", "/v1/admission", secretRoot, `{"algorithm": "fair"}`, 400, "algorithm"},
		{"PUT", "/v1/admission", secretRoot, `{"tfm": 0}`, 400, "tfm"},
		{"PUT", "/v1/admission", secretRoot, `{"tfm": -1}`, 400, "tfm"},
		{"PUT", "/v1/admission", secretRoot, `{"tfm": 1e-320}`, 400, "tfm"},
		{"PUT", "/v1/admission", secretRoot, `{"algorithm": "static", "tfm": 1e-9}`, 400, "tfm"},
		{"PUT", "/v1/admission", secretRoot, `{"tfm": "3"}`, 400, "tfm"},
		{"PUT", "/v1/admission", secretRoot, `{"max_runs": 500}`, 400, "max_runs"},
		{"PUT", "/v1/admission", secretRoot, `{"tfm": 2, "tmf": 1}`, 400, "tmf"},
		{"GET", "/v1/usage", secretAdmin, "", 403, ""},
		{"GET", "/v1/usage", "", "", 401, ""},
	} {
		var body any
		if tc.body != "" {
			body = tc.body
		}
		status, out := b.call(t, tc.method, tc.path, tc.secret, body)
		require.Equal(t, tc.status, status, "%s %s %s: %s", tc.method, tc.path, tc.secret, out)
		require.Equal(t, tc.field, apiErr(t, out).Field, string(out))
	}
	status, out := b.call(t, "GET", "/v1/admission", secretAdmin, nil)
	require.Equal(t, 200, status, string(out))
	v := decode[api.AdmissionView](t, out)
	require.Equal(t, api.AlgorithmNoLimit, v.Algorithm, "the default")
	require.Equal(t, 1.0, v.TFM)
	require.Nil(t, v.Limit)
	require.Equal(t, 2, v.Tenants)

	// Refusals of known tokens are audited on shard 0 with their names,
	// folded (each row counts its repeats).
	refusals := map[string]int{}
	rows, err := b.dbs[0].Query(b.ctx, `SELECT actor, 1 + repeats FROM audit WHERE action = 'admission.set' AND outcome = 'refused'`)
	require.NoError(t, err)
	for rows.Next() {
		var actor string
		var n int
		require.NoError(t, rows.Scan(&actor, &n))
		refusals[actor] += n
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]int{"a-ci": 1, "ops": 1, "root": 8}, refusals)
	require.Zero(t, b.count(t, 0, `SELECT count(*) FROM audit WHERE outcome = 'ok'`))
}

// A tokens file that gives a tenant's token a config privilege stops the
// gateway at start, with the loader's message.
func TestGatewayRefusesTenantConfigToken(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "tokens.json")
	require.NoError(t, os.WriteFile(path, []byte("["+entry("sneaky", "s", "acme", "runs:start", "config:write")+"]"), 0o600))
	cfg := DefaultConfig([]string{"postgres://postgres@127.0.0.1:1/none"}, "nats://127.0.0.1:1")
	cfg.TokensFile = path
	cfg.Addr = "127.0.0.1:0"
	err := Run(context.Background(), cfg, RunOptions{Logger: discardLogger()})
	require.Error(t, err)
	require.Contains(t, err.Error(), "HARVEST_GATEWAY_TOKENS_FILE")
	require.Contains(t, err.Error(), "config:write")
	_, perr := auth.LoadTokens(path)
	require.ErrorContains(t, err, perr.Error())
}

// admissionDecisions reads the admission decision counter (summed over all
// the tests' gateways) by outcome, and checks it has no other attribute.
func admissionDecisions(t *testing.T) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, metricReader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "harvest.gateway.admission.decisions" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				require.Equal(t, 1, dp.Attributes.Len(), "outcome only")
				v, ok := dp.Attributes.Value("outcome")
				require.True(t, ok)
				out[v.AsString()] += dp.Value
			}
		}
	}
	return out
}

// The system limit is exact on one shard, whatever the interleaving: three
// gateways, three tenants, 300 concurrent starts and max_runs 40 leave
// exactly 40 unfinished runs. (Every start group on the shard takes the
// shard's admission lock, so no two groups judge the same total.)
func TestAdmissionSystemLimitExactOnOneShard(t *testing.T) {
	t.Parallel()
	tokens := eightTenants(t)
	shard := []string{testsvc.NewDBURL(t)}
	a := setup(t, setupOpts{Tokens: tokens, MaxRuns: 40, Shards: shard})
	gws := []*bundle{a,
		setup(t, setupOpts{Tokens: tokens, MaxRuns: 40, Shards: shard, NATSURL: a.natsURL}),
		setup(t, setupOpts{Tokens: tokens, MaxRuns: 40, Shards: shard, NATSURL: a.natsURL})}
	secrets := []string{secretA, secretB, "secret-t2"}
	var clients []*client.Client
	for _, g := range gws {
		for _, s := range secrets {
			clients = append(clients, g.client(t, s))
		}
	}
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range 300 {
		wg.Go(func() {
			<-start
			_, err := clients[i%len(clients)].Start(context.Background(), "echo", "shared", nil, client.StartOptions{ID: fmt.Sprint("sys-", i)})
			var ae *api.Error
			switch {
			case err == nil:
				admitted.Add(1)
			case errors.As(err, &ae) && ae.Code == api.CodeOverLimit:
				refused.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	require.EqualValues(t, 40, admitted.Load())
	require.EqualValues(t, 260, refused.Load())
	require.Equal(t, 40, a.count(t, 0, `SELECT count(*) FROM runs WHERE finished_at IS NULL`))
}

// The system limit is exact across shards, whatever the interleaving:
// three gateways, three tenants on two shards and 50 concurrent clients
// starting and cancelling runs, under No-Limit and under Dynamic. While
// they run, a sampler checks the invariant that makes it so (each shard
// holds no more unfinished runs than its lease, and the ledger no more
// than max_runs); afterwards the shards hold at most max_runs, and starts
// sent one at a time fill the system to exactly max_runs: no capacity is
// lost in the leases.
func TestAdmissionSystemLimitExactAcrossShards(t *testing.T) {
	t.Parallel()
	for _, algo := range []string{"no_limit", "dynamic"} {
		t.Run(algo, func(t *testing.T) {
			t.Parallel()
			const maxRuns = 40
			tokens := eightTenants(t)
			a := setup(t, setupOpts{Tokens: tokens, MaxRuns: maxRuns})
			gws := []*bundle{a,
				setup(t, setupOpts{Tokens: tokens, MaxRuns: maxRuns, Shards: a.urls, NATSURL: a.natsURL}),
				setup(t, setupOpts{Tokens: tokens, MaxRuns: maxRuns, Shards: a.urls, NATSURL: a.natsURL})}
			if algo == "dynamic" {
				putAdmission(t, a, `{"algorithm": "dynamic", "tfm": 3}`)
				for _, g := range gws {
					require.Eventually(t, func() bool { return g.gw.adm.watcher.Config().Algorithm == api.AlgorithmDynamic },
						30*time.Second, 5*time.Millisecond)
				}
			}
			secrets := []string{secretA, secretB, "secret-t2"}
			homes := map[int]bool{}
			for _, tn := range []string{tenantOn[0], tenantOn[1], "t2"} {
				homes[a.gw.home(tn)] = true
			}
			require.Len(t, homes, 2, "the tenants live on both shards")

			unfinished := func() int {
				return a.count(t, 0, `SELECT count(*) FROM runs WHERE finished_at IS NULL`) +
					a.count(t, 1, `SELECT count(*) FROM runs WHERE finished_at IS NULL`)
			}
			// The sampler: each figure is read in one statement, so each
			// holds at an instant; together they bound the total.
			stop := make(chan struct{})
			var sampler sync.WaitGroup
			var samples atomic.Int64
			sampler.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					for s := range 2 {
						over := a.count(t, s, `SELECT count(*) FROM admission_lease
							WHERE (SELECT coalesce(sum(running), 0) FROM tenant_running) > granted - returned`)
						if over != 0 {
							t.Errorf("shard %d holds more unfinished runs than its lease", s)
							return
						}
					}
					if held := a.count(t, 0, `SELECT coalesce(sum(granted - returned), 0) FROM admission_ledger`); held > maxRuns {
						t.Errorf("the ledger holds %d, over max_runs %d", held, maxRuns)
						return
					}
					samples.Add(1)
				}
			})

			var admitted, refused, cancelled, unavailable atomic.Int64
			var wg sync.WaitGroup
			begin := make(chan struct{})
			for c := range 50 {
				g, secret := gws[c%3], secrets[(c/3)%3]
				cl := g.client(t, secret)
				wg.Go(func() {
					<-begin
					for i := range 8 {
						id := fmt.Sprintf("c%d-%d", c, i)
						// 50 clients opening connections at once on two
						// cores can outlast the tests' 1 s connect
						// timeout: a 503 is sent again, as a client
						// would (a start by its id, so it stays one).
						var err error
						var ae *api.Error
						for try := 0; try < 20; try++ {
							_, err = cl.Start(context.Background(), "echo", "shared", nil, client.StartOptions{ID: id})
							if !errors.As(err, &ae) || ae.Code != api.CodeUnavailable {
								break
							}
							unavailable.Add(1)
						}
						switch {
						case err == nil:
							admitted.Add(1)
							// Every third admitted run is cancelled while
							// the others keep starting.
							if i%3 == 0 {
								status, out := g.call(t, "POST", "/v1/runs/"+id+"/cancel", secret, nil)
								for try := 0; status == 503 && try < 20; try++ {
									unavailable.Add(1)
									status, out = g.call(t, "POST", "/v1/runs/"+id+"/cancel", secret, nil)
								}
								if status != 200 {
									t.Errorf("cancel %s: %d %s", id, status, out)
								}
								cancelled.Add(1)
							}
						case errors.As(err, &ae) && ae.Code == api.CodeOverLimit:
							refused.Add(1)
						default:
							t.Error(err)
						}
					}
				})
			}
			close(begin)
			wg.Wait()
			close(stop)
			sampler.Wait()
			t.Logf("%d admitted, %d cancelled, %d refused, %d sent again after a 503, %d samples",
				admitted.Load(), cancelled.Load(), refused.Load(), unavailable.Load(), samples.Load())
			require.Positive(t, refused.Load(), "the clients pressed past the limit")
			require.LessOrEqual(t, unfinished(), maxRuns)

			// One at a time, round the tenants, until every start is
			// refused: the system then holds exactly max_runs under
			// No-Limit. (Under Dynamic a tenant's limit shrinks as the
			// total grows, so the last runs of the limit may stay free.)
			if algo == "no_limit" {
				for i := 0; unfinished() < maxRuns; i++ {
					require.Less(t, i, 3*maxRuns, "capacity was lost: %d unfinished", unfinished())
					_, err := gws[i%3].client(t, secrets[i%3]).Start(context.Background(), "echo", "shared", nil,
						client.StartOptions{ID: fmt.Sprint("fill-", i)})
					var ae *api.Error
					if err != nil && !(errors.As(err, &ae) && ae.Code == api.CodeOverLimit) {
						require.NoError(t, err)
					}
				}
				require.Equal(t, maxRuns, unfinished())
				for i, g := range gws {
					_, err := g.client(t, secrets[i]).Start(context.Background(), "echo", "shared", nil,
						client.StartOptions{ID: fmt.Sprint("over-", i)})
					var ae *api.Error
					require.True(t, errors.As(err, &ae) && ae.Code == api.CodeOverLimit, "%v", err)
				}
				require.Equal(t, maxRuns, unfinished())
			}
		})
	}
}
