package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
	"github.com/harvest-run/harvest/pkg/worker"
)

// fleet is a gateway over two shards with a worker on each, serving the
// queues work, other and flood.
type fleet struct {
	base string
	// acme and globex are the tenants' clients.
	acme, globex *client.Client
}

// jobInput is what the test's handler reads: fail makes a run's first
// attempt fail; ms is how long a task takes.
type jobInput struct {
	Fail bool `json:"fail"`
	MS   int  `json:"ms"`
}

func startFleet(t *testing.T) *fleet {
	t.Helper()
	urls := []string{testsvc.NewDBURL(t), testsvc.NewDBURL(t)}
	natsURL := testsvc.NATSURL(t)
	nc, err := nats.Connect(natsURL)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	set, err := auth.ParseTokens([]byte("[" + strings.Join([]string{
		token("root", "root-secret", "", "config:read", "config:write", "weights:read", "weights:write"),
		token("acme-ci", "acme-secret", "acme", "runs:start", "runs:read"),
		token("globex-ci", "globex-secret", "globex", "runs:start", "runs:read"),
	}, ",") + "]"))
	require.NoError(t, err)
	cfg := gateway.DefaultConfig(urls, natsURL)
	cfg.ConnectTimeout = time.Second
	cfg.PoolSize = 4
	cfg.TraceURL = "http://127.0.0.1:16686/trace/{trace_id}"
	// The flood below starts 120 runs on one shard at once. Under the
	// shipped system limit of 128 the other shard's share of the limit may
	// still be reserved when it comes, and part of the batch would be
	// refused: this test is about the console, not admission.
	cfg.MaxRuns = 10_000
	require.NoError(t, cfg.Validate())
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	g, err := gateway.New(gateway.Options{Config: cfg, Tokens: auth.NewStore(set), NATS: nc, Logger: logger})
	require.NoError(t, err)
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(func() {
		srv.Close()
		g.Close()
	})

	var failed sync.Map // run id -> its first attempt failed
	for shard, u := range urls {
		pool, err := pgxpool.New(context.Background(), u)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		wnc, err := nats.Connect(natsURL)
		require.NoError(t, err)
		t.Cleanup(wnc.Close)
		wcfg := worker.DefaultConfig()
		wcfg.Shard = shard
		wcfg.Queues = map[string]float64{"work": 1, "other": 1, "flood": 1}
		wcfg.PollInterval = 100 * time.Millisecond
		wcfg.MaxConcurrentClaims = 4
		w, err := worker.New(pool, wcfg, worker.Options{NATS: wnc, Logger: logger})
		require.NoError(t, err)
		w.HandleFunc("job", func(ctx context.Context, task worker.Task) (worker.Result, error) {
			var in jobInput
			_ = json.Unmarshal(task.Input, &in)
			if in.Fail {
				if _, again := failed.LoadOrStore(task.Tenant+"/"+task.RunID, true); !again {
					return worker.Result{}, errors.New("the first attempt fails")
				}
			}
			select {
			case <-time.After(time.Duration(in.MS) * time.Millisecond):
			case <-ctx.Done():
			}
			return worker.Result{Output: json.RawMessage(`{"done":true}`)}, nil
		})
		ctx, stop := context.WithCancel(context.Background())
		ended := make(chan error, 1)
		go func() { ended <- w.Run(ctx) }()
		t.Cleanup(func() { stop(); <-ended })
		<-w.Ready()
	}
	f := &fleet{base: srv.URL}
	for _, c := range []struct {
		dst    **client.Client
		secret string
	}{{&f.acme, "acme-secret"}, {&f.globex, "globex-secret"}} {
		cl, err := client.New(client.Options{URL: srv.URL, Token: c.secret})
		require.NoError(t, err)
		*c.dst = cl
	}
	return f
}

// browser starts headless Chromium for the test; the returned context
// bounds every step.
func browser(t *testing.T) context.Context {
	t.Helper()
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox, // the tests run as root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	)
	ctx, cancel := chromedp.NewContext(alloc)
	// The first call starts the browser; it must not carry a timeout.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")))
	ctx, cancelSteps := context.WithTimeout(ctx, 4*time.Minute)
	t.Cleanup(func() {
		cancelSteps()
		cancel()
		cancelAlloc()
	})
	return ctx
}

// screenshot saves the page under the test's temp directory and, when
// HARVEST_TEST_SCREENSHOT_DIR is set, there too (README's picture).
func screenshot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	// Quality 100 gives a PNG; below that Chromium sends a JPEG.
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.Greater(t, len(shot), 1000)
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), shot, 0o644))
	if out := os.Getenv("HARVEST_TEST_SCREENSHOT_DIR"); out != "" {
		require.NoError(t, os.WriteFile(filepath.Join(out, name), shot, 0o644))
	}
}

// waitJS waits until a JavaScript expression is true on the page, without
// reloading it (the live refresh brings changes in).
func waitJS(t *testing.T, ctx context.Context, expr string) {
	t.Helper()
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingInterval(100*time.Millisecond),
		chromedp.WithPollingTimeout(90*time.Second)))
	require.NoError(t, err, "waiting for %s", expr)
}

func textOf(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(t, err, sel)
	return strings.TrimSpace(s)
}

func signIn(t *testing.T, ctx context.Context, base, secret string) {
	t.Helper()
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(base+"/admin"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), secret),
	))
	require.NoError(t, clickAndLoad(ctx, "signin"))
}

func startRun(t *testing.T, c *client.Client, id, queue, key string, in jobInput, attempts int) {
	t.Helper()
	_, err := c.Start(context.Background(), "job", queue, in, client.StartOptions{ID: id, FairnessKey: key, MaxAttempts: attempts})
	require.NoError(t, err, id)
}

func waitStatus(t *testing.T, c *client.Client, id string, want api.Status) {
	t.Helper()
	run, err := c.Wait(context.Background(), id, 60*time.Second)
	require.NoError(t, err, id)
	require.Equal(t, want, run.Status, id)
}

// The console in a real browser: an operator finds a run by filter, opens
// it, retries a failed run and cancels a waiting one, pauses a queue and
// sees the workers leave it alone while they keep serving another, and
// watches the key chart fill during a small flood; a tenant sees its own
// runs only and none of the configuration. Screenshots of each page go to
// the test's temp directory (and HARVEST_TEST_SCREENSHOT_DIR).
func TestConsoleInChromium(t *testing.T) {
	needChromium(t)
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	f := startFleet(t)
	ctx := browser(t)
	shots := t.TempDir()

	startRun(t, f.acme, "acme-ok", "work", "", jobInput{}, 0)
	startRun(t, f.acme, "acme-fail", "work", "", jobInput{Fail: true}, 1)
	startRun(t, f.acme, "acme-idle", "idle", "", jobInput{}, 0) // no worker serves idle
	startRun(t, f.globex, "globex-private", "work", "", jobInput{}, 0)
	waitStatus(t, f.acme, "acme-ok", api.StatusCompleted)
	waitStatus(t, f.acme, "acme-fail", api.StatusFailed)
	waitStatus(t, f.globex, "globex-private", api.StatusCompleted)

	// The operator: every tenant's runs, then a filter.
	signIn(t, ctx, f.base, "root-secret")
	require.NoError(t, clickAndLoad(ctx, "nav-runs"))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.ID("runs"))))
	waitJS(t, ctx, `document.querySelector('tr[data-run="globex/globex-private"]') !== null`)
	screenshot(t, ctx, shots, "console-runs.png")
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue(chromedp.CSS(`#run-filter [name="tenant"]`), "acme"),
		chromedp.SetValue(chromedp.CSS(`#run-filter [name="status"]`), "failed"),
	))
	require.NoError(t, clickAndLoad(ctx, "filter"))
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`Array.from(document.querySelectorAll('#runs tr[data-run]')).map(r => r.dataset.run)`))
	require.NoError(t, err)
	require.Equal(t, []string{"acme/acme-fail"}, rows)

	// Open the failed run and retry it: the page follows it to completed.
	_, err = chromedp.Run(ctx, chromedp.Evaluate[bool](
		`(() => { document.querySelector('tr[data-run="acme/acme-fail"] a.run-link').click(); return true })()`))
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.ID("retry"))))
	require.Equal(t, "failed", textOf(t, ctx, "#run-status"))
	require.Contains(t, textOf(t, ctx, "#run-attempts"), "1 of 1")
	link, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById('trace-link').href`))
	require.NoError(t, err)
	require.Regexp(t, `^http://127\.0\.0\.1:16686/trace/[0-9a-f]{32}$`, link)
	screenshot(t, ctx, shots, "console-run.png")
	require.NoError(t, clickAndLoad(ctx, "retry"))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.ID("done"))))
	waitJS(t, ctx, `document.getElementById('run-status').textContent.trim() === 'completed'`)
	require.Contains(t, textOf(t, ctx, "#run-attempts"), "2 of")
	waitStatus(t, f.acme, "acme-fail", api.StatusCompleted)

	// Cancel the run no worker serves.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(f.base+"/admin/runs/acme/acme-idle"), chromedp.WaitVisible(chromedp.ID("cancel"))))
	require.Equal(t, "queued", textOf(t, ctx, "#run-status"))
	require.NoError(t, clickAndLoad(ctx, "cancel"))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.ID("done"))))
	require.Equal(t, "cancelled", textOf(t, ctx, "#run-status"))
	waitStatus(t, f.acme, "acme-idle", api.StatusCancelled)

	// Pause the queue work: a start waits in it while the same workers
	// complete runs of the queue other, one after the other; resume lets
	// it through.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(f.base+"/admin/queues/work"), chromedp.WaitVisible(chromedp.ID("pause"))))
	require.NoError(t, clickAndLoad(ctx, "pause"))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.ID("paused"))))
	require.Contains(t, textOf(t, ctx, "#paused"), "root")
	startRun(t, f.acme, "acme-held", "work", "", jobInput{}, 0)
	for i := range 3 {
		id := fmt.Sprint("acme-other-", i)
		startRun(t, f.acme, id, "other", "", jobInput{}, 0)
		waitStatus(t, f.acme, id, api.StatusCompleted)
	}
	held, err := f.acme.Get(context.Background(), "acme-held")
	require.NoError(t, err)
	require.Equal(t, api.StatusQueued, held.Status, "no worker claims from a paused queue")
	screenshot(t, ctx, shots, "console-queue-paused.png")
	require.NoError(t, clickAndLoad(ctx, "resume"))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.ID("done"))))
	waitStatus(t, f.acme, "acme-held", api.StatusCompleted)
	gone, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById('paused') === null`))
	require.NoError(t, err)
	require.True(t, gone)

	// The key chart of the queue flood: empty, then a flood key and a
	// trickle key appear in it while the flood drains.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(f.base+"/admin/queues/flood"), chromedp.WaitVisible(chromedp.ID("share-chart"))))
	none, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('#share-chart [data-key]').length`))
	require.NoError(t, err)
	require.Zero(t, none)
	var reqs []api.StartRequest
	for i := range 120 {
		key := "big"
		if i%10 == 0 {
			key = "small"
		}
		r, err := client.StartOptions{ID: fmt.Sprint("flood-", i), FairnessKey: key}.Request("job", "flood", jobInput{MS: 20})
		require.NoError(t, err)
		reqs = append(reqs, r)
	}
	res, err := f.acme.StartBatch(context.Background(), reqs)
	require.NoError(t, err)
	for _, r := range res {
		require.Nil(t, r.Error)
	}
	waitJS(t, ctx, `document.querySelector('#share-chart [data-key="acme/big"]') !== null &&
		document.querySelector('#share-chart [data-key="acme/small"]') !== null`)
	shares, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]string](
		`Object.fromEntries(Array.from(document.querySelectorAll('#share-chart [data-key]')).map(g => [g.dataset.key, g.dataset.share]))`))
	require.NoError(t, err)
	require.NotEmpty(t, shares["acme/big"])
	require.NotEmpty(t, shares["acme/small"])
	waitJS(t, ctx, `document.querySelector('#keys tr[data-key="acme/big"]') !== null`)
	screenshot(t, ctx, shots, "console-queue.png")
	require.NoError(t, clickAndLoad(ctx, "nav-queues"))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.ID("queues"))))
	waitJS(t, ctx, `document.querySelector('#queues tr[data-queue="flood"]') !== null`)
	screenshot(t, ctx, shots, "console-queues.png")
	require.NoError(t, clickAndLoad(ctx, "signout"))

	// A tenant: its own runs, nothing of globex, no configuration.
	signIn(t, ctx, f.base, "acme-secret")
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.ID("runs"))))
	require.Equal(t, "acme", textOf(t, ctx, "#session-tenant"))
	html, err := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("html")))
	require.NoError(t, err)
	require.False(t, strings.Contains(html, "globex"), "the tenant's page names the other tenant")
	owners, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](
		`Array.from(new Set(Array.from(document.querySelectorAll('#runs tr[data-run]')).map(r => r.dataset.run.split('/')[0])))`))
	require.NoError(t, err)
	require.Equal(t, []string{"acme"}, owners)
	require.NoError(t, chromedp.Do(ctx, chromedp.SetValue(chromedp.CSS(`#run-filter [name="queue"]`), "work")))
	require.NoError(t, clickAndLoad(ctx, "filter"))
	waitJS(t, ctx, `document.querySelector('tr[data-run="acme/acme-ok"]') !== null`)
	for _, id := range []string{"nav-queues", "nav-admission"} {
		absent, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`document.getElementById(%q) === null`, id)))
		require.NoError(t, err)
		require.True(t, absent, id)
	}
	screenshot(t, ctx, shots, "console-tenant-runs.png")
	for _, path := range []string{"/admin/queues", "/admin/queues/flood", "/admin/runs/globex/globex-private", "/admin/runs?tenant=globex"} {
		require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(f.base+path), chromedp.WaitVisible(chromedp.ID("refused"))), path)
		html, err := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("main")))
		require.NoError(t, err)
		require.False(t, strings.Contains(html, "globex-private"), path)
	}
	for _, name := range []string{"console-runs.png", "console-run.png", "console-queue-paused.png", "console-queue.png", "console-queues.png", "console-tenant-runs.png"} {
		_, err := os.Stat(filepath.Join(shots, name))
		require.NoError(t, err, name)
	}
}
