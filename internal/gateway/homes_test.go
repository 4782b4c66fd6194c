package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/directory"
	"github.com/harvest-run/harvest/internal/shards"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

// A tenant's recorded home outlives a change of the shard list: a gateway
// given a third shard keeps writing and reading the tenant's runs where
// the first gateway placed them, though the hash over three shards now
// points elsewhere.
func TestAddingAShardMovesNobody(t *testing.T) {
	// Not parallel: the package's parallel tests already come near the
	// test server's connection limit.
	tenant := ""
	for _, name := range []string{"acme", "globex", "initech", "umbrella", "hooli", "wayne", "stark", "tyrell"} {
		if shards.Home(name, 2) != shards.Home(name, 3) {
			tenant = name
			break
		}
	}
	require.NotEmpty(t, tenant)
	set, err := auth.ParseTokens([]byte("[" + entry("ci", "s", tenant, "runs:start", "runs:read") + "]"))
	require.NoError(t, err)
	two := setup(t, setupOpts{Tokens: set})
	status, body := two.call(t, "POST", "/v1/runs", "s", startBody(`"id":"before"`))
	require.Equal(t, http.StatusCreated, status, string(body))
	home := shards.Home(tenant, 2)
	require.Equal(t, home, decode[api.Run](t, body).Shard)

	three := setup(t, setupOpts{Tokens: set, Shards: append(append([]string{}, two.urls...), testsvc.NewDBURL(t)), NATSURL: two.natsURL})
	status, body = three.call(t, "POST", "/v1/runs", "s", startBody(`"id":"after"`))
	require.Equal(t, http.StatusCreated, status, string(body))
	require.Equal(t, home, decode[api.Run](t, body).Shard, "the recorded home, not the hash over three shards")
	status, body = three.call(t, "GET", "/v1/runs/before", "s", nil)
	require.Equal(t, http.StatusOK, status, string(body))
	require.Equal(t, 2, two.count(t, home, `SELECT count(*) FROM runs WHERE tenant = $1`, tenant))
}

// moveEntry sets the tenant's entry as a move would, without telling the
// gateways (as if the change event were lost).
func (b *bundle) moveEntry(t *testing.T, tenant string, shard, from int) {
	t.Helper()
	e, err := directory.Get(b.ctx, b.dbs[0], tenant)
	require.NoError(t, err)
	e.Shard, e.Phase, e.MovingFrom, e.MoveTo = shard, directory.PhaseHome, nil, nil
	if from >= 0 {
		e.Phase, e.MovingFrom = directory.PhaseCopying, &from
	}
	_, err = directory.Update(b.ctx, b.dbs[0], e)
	require.NoError(t, err)
}

// A gateway whose cache still names the old home is refused there by the
// fence, reads the directory again and writes the start on the new home.
func TestFencedHomeSendsStartsToTheNewOne(t *testing.T) {
	// Not parallel: the package's parallel tests already come near the
	// test server's connection limit.
	b := setup(t, setupOpts{})
	tenant := tenantOn[0]
	status, body := b.call(t, "POST", "/v1/runs", secretA, startBody(`"id":"first"`))
	require.Equal(t, http.StatusCreated, status, string(body))
	require.Equal(t, 0, decode[api.Run](t, body).Shard)

	_, err := b.dbs[0].Exec(b.ctx, `INSERT INTO tenant_fences (tenant, moved_to) VALUES ($1, 1)`, tenant)
	require.NoError(t, err)
	b.moveEntry(t, tenant, 1, -1)
	cached, ok := b.gw.dir.Cached(tenant)
	require.True(t, ok)
	require.Equal(t, 0, cached.Shard, "the gateway has not heard of the change")

	status, body = b.call(t, "POST", "/v1/runs", secretA, startBody(`"id":"second"`))
	require.Equal(t, http.StatusCreated, status, string(body))
	require.Equal(t, 1, decode[api.Run](t, body).Shard)
	require.Zero(t, b.count(t, 0, `SELECT count(*) FROM runs WHERE tenant = $1 AND id = 'second'`, tenant))
	// A start over NATS goes the same way.
	status, body = b.natsCall(t, "harvest.start."+tenant, startBody(`"id":"third"`))
	require.Equal(t, http.StatusCreated, status, string(body))
	require.Equal(t, 2, b.count(t, 1, `SELECT count(*) FROM runs WHERE tenant = $1`, tenant))
}

// While a tenant's runs are copied, a start sent again is answered from
// the old home, never written twice; a new id goes to the new home; a
// read finds a run on either; a deferred start waits for the end of the
// copy; a run the copy holds cannot be cancelled until it lands.
func TestStartsDuringACopy(t *testing.T) {
	// Not parallel: the package's parallel tests already come near the
	// test server's connection limit.
	b := setup(t, setupOpts{})
	tenant := tenantOn[0]
	for _, id := range []string{"old", "held"} {
		status, body := b.call(t, "POST", "/v1/runs", secretA, startBody(`"id":"`+id+`"`))
		require.Equal(t, http.StatusCreated, status, string(body))
	}
	_, err := b.dbs[0].Exec(b.ctx, `INSERT INTO tenant_fences (tenant, moved_to) VALUES ($1, 1)`, tenant)
	require.NoError(t, err)
	b.moveEntry(t, tenant, 1, 0)
	_, err = b.gw.dir.Reload(b.ctx, tenant)
	require.NoError(t, err)

	status, body := b.call(t, "POST", "/v1/runs", secretA, startBody(`"id":"old"`))
	require.Equal(t, http.StatusOK, status, "a replay: %s", body)
	require.Equal(t, 0, decode[api.Run](t, body).Shard)
	status, body = b.call(t, "POST", "/v1/runs", secretA, `{"name":"other","queue":"shared","id":"old"}`)
	require.Equal(t, http.StatusConflict, status, string(body))
	require.Zero(t, b.count(t, 1, `SELECT count(*) FROM runs WHERE tenant = $1`, tenant))

	status, body = b.call(t, "POST", "/v1/runs", secretA, startBody(`"id":"new"`))
	require.Equal(t, http.StatusCreated, status, string(body))
	require.Equal(t, 1, decode[api.Run](t, body).Shard)

	for id, shard := range map[string]int{"old": 0, "new": 1} {
		status, body = b.call(t, "GET", "/v1/runs/"+id, secretA, nil)
		require.Equal(t, http.StatusOK, status, string(body))
		require.Equal(t, shard, decode[api.Run](t, body).Shard)
	}

	status, body = b.call(t, "POST", "/v1/runs", secretA, startBody(`"id":"later","throttle":{"key":"k","limit":1,"period":"1m"}`))
	require.Equal(t, http.StatusServiceUnavailable, status, string(body))
	require.Positive(t, apiErr(t, body).RetryAfterMS)

	_, err = b.dbs[0].Exec(b.ctx, `INSERT INTO move_out (run_pk, tenant, moved_to)
		SELECT pk, tenant, 1 FROM runs WHERE tenant = $1 AND id = 'held'`, tenant)
	require.NoError(t, err)
	status, body = b.call(t, "POST", "/v1/runs/held/cancel", secretA, nil)
	require.Equal(t, http.StatusServiceUnavailable, status, string(body))
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM runs WHERE tenant = $1 AND id = 'held' AND status = 'queued'`, tenant))
	status, body = b.call(t, "POST", "/v1/runs/old/cancel", secretA, nil)
	require.Equal(t, http.StatusOK, status, string(body))
	require.Equal(t, api.StatusCancelled, decode[api.Run](t, body).Status)
}

// Between a move's fence and its switch the old home refuses the tenant's
// starts and the directory still names it: a start is held until the
// switch, then written on the new home, never refused.
func TestStartIsHeldUntilTheSwitch(t *testing.T) {
	// Not parallel: the package's parallel tests already come near the
	// test server's connection limit.
	b := setup(t, setupOpts{})
	tenant := tenantOn[0]
	b.startRun(t, secretA, http.StatusCreated, startBody(`"id":"first"`))
	_, err := b.dbs[0].Exec(b.ctx, `INSERT INTO tenant_fences (tenant, moved_to) VALUES ($1, 1)`, tenant)
	require.NoError(t, err)
	e, err := directory.Get(b.ctx, b.dbs[0], tenant)
	require.NoError(t, err)
	to := 1
	e.Phase, e.MoveTo = directory.PhaseFencing, &to
	e, err = directory.Update(b.ctx, b.dbs[0], e)
	require.NoError(t, err)

	type answer struct {
		status int
		body   []byte
		err    error
	}
	done := make(chan answer, 1)
	go func() {
		// No require here: a failure is reported by the test's goroutine.
		req, err := http.NewRequestWithContext(b.ctx, "POST", b.srv.URL+"/v1/runs", strings.NewReader(startBody(`"id":"held"`)))
		if err != nil {
			done <- answer{err: err}
			return
		}
		req.Header.Set("Authorization", "Bearer "+secretA)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- answer{err: err}
			return
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		done <- answer{res.StatusCode, body, err}
	}()
	from := 0
	e.Shard, e.Phase, e.MoveTo, e.MovingFrom = 1, directory.PhaseCopying, nil, &from
	_, err = directory.Update(b.ctx, b.dbs[0], e)
	require.NoError(t, err)
	got := <-done
	require.NoError(t, got.err)
	require.Equal(t, http.StatusCreated, got.status, string(got.body))
	require.Equal(t, 1, decode[api.Run](t, got.body).Shard)
}
