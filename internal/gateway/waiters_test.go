package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/claim"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/pkg/dispatch"
	"github.com/harvest-run/harvest/pkg/worker"
)

// longFallback makes a test's waiters reread only after an hour: whatever
// ends their wait sooner is the run event (or the gateway's close).
func longFallback(c *Config) { c.WaitFallback = time.Hour }

// waitAnswer is what a long poll over HTTP answered.
type waitAnswer struct {
	status int
	header http.Header
	body   []byte
}

// waitFor sends GET /v1/runs/{id}?wait= with the secret and returns the
// answer; b.ctx bounds it.
func (b *bundle) waitFor(t *testing.T, secret, id string, wait time.Duration) waitAnswer {
	t.Helper()
	req, err := http.NewRequestWithContext(b.ctx, http.MethodGet,
		b.srv.URL+"/v1/runs/"+url.PathEscape(id)+"?wait="+wait.String(), nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := b.srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return waitAnswer{resp.StatusCode, resp.Header, body}
}

// waitInBackground starts a long poll and returns where its answer comes.
// It does not call t's fatal checks off the test's goroutine.
func (b *bundle) waitInBackground(secret, id string, wait time.Duration) <-chan waitAnswer {
	return b.getInBackground(secret, "/v1/runs/"+url.PathEscape(id)+"?wait="+wait.String())
}

// getInBackground sends GET path with the secret and returns where its
// answer comes, without t's fatal checks off the test's goroutine.
func (b *bundle) getInBackground(secret, path string) <-chan waitAnswer {
	out := make(chan waitAnswer, 1)
	go func() {
		var a waitAnswer
		req, err := http.NewRequestWithContext(b.ctx, http.MethodGet, b.srv.URL+path, nil)
		if err == nil {
			req.Header.Set("Authorization", "Bearer "+secret)
			var resp *http.Response
			if resp, err = b.srv.Client().Do(req); err == nil {
				a.status, a.header = resp.StatusCode, resp.Header
				a.body, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
		}
		if err != nil {
			a.body = []byte(err.Error())
		}
		out <- a
	}()
	return out
}

// step waits for the next step of the long poll of id that ok accepts.
// The steps of other waits signalled meanwhile are dropped: wait for one
// wait at a time.
func (b *bundle) step(t *testing.T, id string, ok func(string) bool) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	s, err := b.gw.waits.steps.WaitFor(ctx, func(s waitStep) bool { return s.ID == id && ok(s.Step) })
	require.NoError(t, err, "no step of the wait for %s", id)
	return s.Step
}

func (b *bundle) asleep(t *testing.T, id string) {
	t.Helper()
	b.step(t, id, func(s string) bool { return s == waitAsleep })
}

// ended waits for the end of the long poll of id and says how it ended.
func (b *bundle) ended(t *testing.T, id string) string {
	t.Helper()
	return b.step(t, id, func(s string) bool { return s != waitAsleep })
}

// A long poll is answered when a real worker finishes its run: the
// worker's run event wakes it, not a reread (the fallback is an hour away)
// and not the end of the wait.
func TestWaitWokenByTheWorkersRunEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{Tune: longFallback})
	b.gw.waits.steps.Init()
	wnc, err := nats.Connect(b.natsURL)
	require.NoError(t, err)
	t.Cleanup(wnc.Close)
	cfg := worker.DefaultConfig()
	cfg.Shard = b.gw.home(tenantOn[0])
	cfg.Queues = map[string]float64{"wq": 1}
	cfg.RunJanitor = false
	w, err := worker.New(b.dbs[cfg.Shard], cfg, worker.Options{NATS: wnc, Logger: discardLogger()})
	require.NoError(t, err)
	running, finish := make(chan string, 1), make(chan struct{})
	w.HandleFunc("echo", func(ctx context.Context, task worker.Task) (worker.Result, error) {
		running <- task.RunID
		select {
		case <-finish:
		case <-ctx.Done():
		}
		return worker.Result{Output: json.RawMessage(`{"done":true}`)}, nil
	})
	ctx, stop := context.WithCancel(b.ctx)
	ended := make(chan error, 1)
	go func() { ended <- w.Run(ctx) }()
	t.Cleanup(func() { stop(); <-ended })
	<-w.Ready()

	_, err = b.client(t, secretA).Start(b.ctx, "echo", "wq", nil, clientOpts("ev 1", ""))
	require.NoError(t, err)
	require.Equal(t, "ev 1", <-running)
	answer := b.waitInBackground(secretA, "ev 1", 30*time.Second)
	b.asleep(t, "ev 1")
	close(finish)
	require.Equal(t, waitEndEvent, b.ended(t, "ev 1"), "the worker's run event woke the wait")
	a := <-answer
	require.Equal(t, http.StatusOK, a.status, string(a.body))
	run := decode[api.Run](t, a.body)
	require.Equal(t, api.StatusCompleted, run.Status)
	require.JSONEq(t, `{"done":true}`, string(run.Output))
}

// A long poll on a debounce start's id is woken by the event of the run
// it fires, which goes out under the run's own id only.
func TestWaitOnADebounceStartWokenByItsRunsEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{Tune: longFallback})
	b.gw.waits.steps.Init()
	c := b.client(t, secretA)
	st, err := c.Start(b.ctx, "echo", "shared", nil, client.StartOptions{
		ID: "deb", Debounce: client.Debounce("", time.Hour, 0)})
	require.NoError(t, err)
	require.True(t, st.Deferred())
	require.NotEqual(t, "deb", st.Run.RunID)
	answer := b.waitInBackground(secretA, "deb", 30*time.Second)
	b.asleep(t, "deb")
	// Cancelled by the run's id, the run is announced under that id alone.
	_, err = c.Cancel(b.ctx, st.Run.RunID)
	require.NoError(t, err)
	require.Equal(t, waitEndEvent, b.ended(t, "deb"))
	a := <-answer
	require.Equal(t, http.StatusOK, a.status, string(a.body))
	run := decode[api.Run](t, a.body)
	require.Equal(t, api.StatusCancelled, run.Status)
	require.Equal(t, "deb", run.ID)
	require.Equal(t, st.Run.RunID, run.RunID)
}

// A run event lost on the way costs only latency: the waiter's reread
// finds the run final (here the run completes straight in the database,
// so no event is sent at all).
func TestWaitLostEventCoveredByReread(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{}) // rereads every 20ms at most
	b.gw.waits.steps.Init()
	_, err := b.client(t, secretA).Start(b.ctx, "echo", "shared", nil, clientOpts("lost", ""))
	require.NoError(t, err)
	res, err := claim.Claim(b.ctx, b.dbs[0], claim.Request{Queue: "shared", Worker: "w"})
	require.NoError(t, err)
	require.True(t, res.OK)
	answer := b.waitInBackground(secretA, "lost", 20*time.Second)
	b.asleep(t, "lost")
	require.NoError(t, claim.Complete(b.ctx, b.dbs[0], res.Task.ID, res.Task.LeaseToken, json.RawMessage(`1`)))
	require.Equal(t, waitEndReread, b.ended(t, "lost"))
	a := <-answer
	require.Equal(t, http.StatusOK, a.status, string(a.body))
	require.Equal(t, api.StatusCompleted, decode[api.Run](t, a.body).Status)
}

// The gateway's one subscription to the run events comes back after NATS
// reconnects: an event sent afterwards still wakes a waiter.
func TestWaitWokenAfterNATSReconnects(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{Tune: longFallback})
	b.gw.waits.steps.Init()
	_, err := b.client(t, secretA).Start(b.ctx, "echo", "shared", nil, clientOpts("rc", ""))
	require.NoError(t, err)
	res, err := claim.Claim(b.ctx, b.dbs[0], claim.Request{Queue: "shared", Worker: "w"})
	require.NoError(t, err)
	require.True(t, res.OK)
	answer := b.waitInBackground(secretA, "rc", 30*time.Second)
	b.asleep(t, "rc")

	back := b.nc.StatusChanged(nats.CONNECTED)
	require.NoError(t, b.nc.ForceReconnect())
	select {
	case <-back:
	case <-time.After(30 * time.Second):
		t.Fatal("the gateway's connection did not come back")
	}
	// Its subscriptions were sent again before anything else on the
	// connection: once a round trip is done, the server has them.
	require.NoError(t, b.nc.Flush())

	require.NoError(t, claim.Complete(b.ctx, b.dbs[0], res.Task.ID, res.Task.LeaseToken, json.RawMessage(`2`)))
	run, err := b.client(t, secretA).Get(b.ctx, "rc")
	require.NoError(t, err)
	// What a worker sends, from a connection of its own.
	wnc, err := nats.Connect(b.natsURL)
	require.NoError(t, err)
	t.Cleanup(wnc.Close)
	require.NoError(t, dispatch.Publish(b.ctx, wnc, dispatch.Subjects{}.Runs(tenantOn[0], "rc"), run))
	require.NoError(t, wnc.Flush())
	require.Equal(t, waitEndEvent, b.ended(t, "rc"))
	a := <-answer
	require.Equal(t, http.StatusOK, a.status, string(a.body))
	require.Equal(t, api.StatusCompleted, decode[api.Run](t, a.body).Status)
}

// The bounds on long polls: a tenant past its own bound gets 429 with
// Retry-After at once, while another tenant still waits; past the
// gateway's bound every tenant gets 429. A wait past a bound for a run
// that is already final gets the run. Close releases every waiter.
func TestWaitBoundsPerTenantAndPerGateway(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{Tune: func(c *Config) {
		longFallback(c)
		c.MaxWaitersPerTenant = 2
		c.MaxWaiters = 3
	}})
	b.gw.waits.steps.Init()
	ca, cb := b.client(t, secretA), b.client(t, secretB)
	for _, id := range []string{"a1", "a2", "a3", "a4"} {
		_, err := ca.Start(b.ctx, "echo", "shared", nil, clientOpts(id, ""))
		require.NoError(t, err)
	}
	for _, id := range []string{"b1", "b2"} {
		_, err := cb.Start(b.ctx, "echo", "shared", nil, clientOpts(id, ""))
		require.NoError(t, err)
	}
	_, err := ca.Cancel(b.ctx, "a4")
	require.NoError(t, err)

	var answers []<-chan waitAnswer
	for _, id := range []string{"a1", "a2"} {
		answers = append(answers, b.waitInBackground(secretA, id, 30*time.Second))
		b.asleep(t, id)
	}

	refused := func(a waitAnswer, setting string) {
		t.Helper()
		require.Equal(t, http.StatusTooManyRequests, a.status, string(a.body))
		require.Equal(t, "1", a.header.Get("Retry-After"))
		e := apiErr(t, a.body)
		require.Equal(t, api.CodeOverLimit, e.Code)
		require.Equal(t, int64(1000), e.RetryAfterMS)
		require.Contains(t, e.Message, setting)
	}
	before := waitsRefused(t)
	refused(b.waitFor(t, secretA, "a3", 30*time.Second), "HARVEST_GATEWAY_MAX_WAITERS_PER_TENANT")
	// A run that is final needs no wait: past the bound it is answered.
	a := b.waitFor(t, secretA, "a4", 30*time.Second)
	require.Equal(t, http.StatusOK, a.status, string(a.body))
	require.Equal(t, api.StatusCancelled, decode[api.Run](t, a.body).Status)

	// The other tenant still waits.
	answers = append(answers, b.waitInBackground(secretB, "b1", 30*time.Second))
	b.asleep(t, "b1")
	// Now the gateway holds three: its bound.
	refused(b.waitFor(t, secretB, "b2", 30*time.Second), "(HARVEST_GATEWAY_MAX_WAITERS)")
	after := waitsRefused(t)
	require.GreaterOrEqual(t, after[boundTenant]-before[boundTenant], int64(1))
	require.GreaterOrEqual(t, after[boundGateway]-before[boundGateway], int64(1))

	// Close releases them at once, each with its run as it stands.
	b.gw.Close()
	ends := map[string]string{}
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	_, err = b.gw.waits.steps.WaitFor(ctx, func(s waitStep) bool {
		if s.Step != waitAsleep {
			ends[s.ID] = s.Step
		}
		return len(ends) == 3
	})
	require.NoError(t, err, "ends so far: %v", ends)
	require.Equal(t, map[string]string{"a1": waitEndClosed, "a2": waitEndClosed, "b1": waitEndClosed}, ends)
	for i := range []string{"a1", "a2", "b1"} {
		a := <-answers[i]
		require.Equal(t, http.StatusOK, a.status, string(a.body))
		require.Equal(t, api.StatusQueued, decode[api.Run](t, a.body).Status)
	}
}

// waitsRefused reads the refused long polls counter (summed over all the
// tests' gateways) by bound, and checks it has no other attribute.
func waitsRefused(t *testing.T) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, metricReader.Collect(context.Background(), &rm))
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "harvest.gateway.waits.refused" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				require.Equal(t, 1, dp.Attributes.Len(), "bound only")
				v, ok := dp.Attributes.Value("bound")
				require.True(t, ok)
				out[v.AsString()] += dp.Value
			}
		}
	}
	return out
}

// Close releases a long poll in progress and leaves neither the run event
// subscription nor a goroutine behind. Not parallel: parallel tests run
// after it, so it sees its own goroutines only.
func TestWaitReleasedAtCloseLeavesNothing(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	b := setup(t, setupOpts{Tune: longFallback})
	b.gw.waits.steps.Init()
	_, err := b.client(t, secretA).Start(b.ctx, "echo", "shared", nil, clientOpts("held", ""))
	require.NoError(t, err)
	answer := b.waitInBackground(secretA, "held", 30*time.Second)
	b.asleep(t, "held")
	require.NotZero(t, b.nc.NumSubscriptions())
	b.gw.Close()
	require.Equal(t, waitEndClosed, b.ended(t, "held"))
	a := <-answer
	require.Equal(t, http.StatusOK, a.status, string(a.body))
	require.Equal(t, api.StatusQueued, decode[api.Run](t, a.body).Status)
	require.Zero(t, b.nc.NumSubscriptions(), "the gateway unsubscribed from everything, the run events too")
}

// The settings of long polls are checked at start, each error naming its
// variable.
func TestWaitSettingsAreValidated(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		tune func(*Config)
		want string
	}{
		{func(c *Config) { c.MaxWaiters = 0 }, "HARVEST_GATEWAY_MAX_WAITERS:"},
		{func(c *Config) { c.MaxWaitersPerTenant = 0 }, "HARVEST_GATEWAY_MAX_WAITERS_PER_TENANT:"},
		{func(c *Config) { c.MaxWaiters, c.MaxWaitersPerTenant = 10, 11 }, "HARVEST_GATEWAY_MAX_WAITERS_PER_TENANT:"},
		{func(c *Config) { c.WaitFallback = c.WaitPoll / 2 }, "HARVEST_GATEWAY_WAIT_FALLBACK:"},
		{func(c *Config) { c.MaxListsPerTenant = 0 }, "HARVEST_GATEWAY_MAX_LISTS_PER_TENANT:"},
	} {
		cfg := DefaultConfig([]string{"postgres://127.0.0.1/x"}, "nats://127.0.0.1:4222")
		require.NoError(t, cfg.Validate())
		c.tune(&cfg)
		require.ErrorContains(t, cfg.Validate(), c.want)
	}
}
