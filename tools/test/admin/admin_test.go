// Package admin tests the gateway's administration page in a real browser:
// headless Chromium (Debian's chromium package) driven by chromedp. It is
// in the tools module so that the product's go.mod does not carry chromedp.
package admin

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
)

// chromiumPath is where Debian's chromium package puts the browser
// (.ci/run installs it when it is missing).
const chromiumPath = "/usr/bin/chromium"

func TestMain(m *testing.M) {
	// Real spans (not exported), so runs carry a trace id for the run
	// page's link.
	otel.SetTracerProvider(sdktrace.NewTracerProvider())
	testsvc.Main(m)
}

// needChromium skips the test without Chromium, except in CI (CI set),
// where a missing browser is a failure.
func needChromium(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s is missing and CI is set: the browser test must run in CI (apt-get install -y chromium)", chromiumPath)
		}
		t.Skipf("skipping the browser test: %s is missing (apt-get install -y chromium); in CI it is required", chromiumPath)
	}
}

func token(name, secret, tenant string, privs ...string) string {
	return fmt.Sprintf(`{"name": %q, "sha256": %q, "tenant": %q, "privileges": ["%s"]}`,
		name, auth.HashSecret(secret), tenant, strings.Join(privs, `", "`))
}

// startGateway serves a gateway over two fresh shards and the test NATS.
func startGateway(t *testing.T) (*gateway.Gateway, string) {
	t.Helper()
	urls := []string{testsvc.NewDBURL(t), testsvc.NewDBURL(t)}
	natsURL := testsvc.NATSURL(t)
	nc, err := nats.Connect(natsURL)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	set, err := auth.ParseTokens([]byte("[" + strings.Join([]string{
		token("root", "root-secret", "", "config:read", "config:write", "weights:read"),
		token("acme-ci", "acme-secret", "acme", "runs:start", "runs:read"),
		token("globex-ci", "globex-secret", "globex", "runs:start", "runs:read"),
	}, ",") + "]"))
	require.NoError(t, err)
	cfg := gateway.DefaultConfig(urls, natsURL)
	cfg.ConnectTimeout = time.Second
	g, err := gateway.New(gateway.Options{Config: cfg, Tokens: auth.NewStore(set), NATS: nc,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	srv := httptest.NewServer(g.Handler())
	t.Cleanup(func() {
		srv.Close()
		g.Close()
	})
	return g, srv.URL
}

// clickAndLoad clicks the element and waits for the page it leads to.
func clickAndLoad(ctx context.Context, id string) error {
	_, err := chromedp.Run(ctx, chromedp.WaitEvent(page.LoadEventFired, nil, chromedp.Click(chromedp.ID(id))))
	return err
}

func TestAdminPageInChromium(t *testing.T) {
	needChromium(t)
	_, base := startGateway(t)

	ctx := browser(t)

	// Load, sign in as the administrator.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(base+"/admin"),
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), "root-secret"),
	))
	require.NoError(t, clickAndLoad(ctx, "signin"))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.ID("algorithm"))))
	maxRuns, err := chromedp.Run(ctx, chromedp.Value(chromedp.ID("max_runs")))
	require.NoError(t, err)
	require.Equal(t, "128", maxRuns)
	algo, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("current-algorithm")))
	require.NoError(t, err)
	require.Equal(t, "No-Limit", algo)

	// Change the algorithm to Dynamic and the TFM to 3; the note follows
	// the drop-down.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SetValue(chromedp.ID("algorithm"), "dynamic"),
		chromedp.SetValue(chromedp.ID("tfm"), "3"),
	))
	_, err = chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("algorithm").dispatchEvent(new Event("change"))`))
	require.NoError(t, err)
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.CSS(`[data-note="dynamic"]`))))
	note, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`[data-note="dynamic"]`)))
	require.NoError(t, err)
	require.Contains(t, note, "Recommended TFM: 3")
	require.NoError(t, clickAndLoad(ctx, "save"))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.ID("saved"))))
	saved, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("saved")))
	require.NoError(t, err)
	require.Contains(t, saved, "Dynamic")
	algo, err = chromedp.Run(ctx, chromedp.Text(chromedp.ID("current-algorithm")))
	require.NoError(t, err)
	require.Equal(t, "Dynamic", algo)
	tfm, err := chromedp.Run(ctx, chromedp.Text(chromedp.ID("current-tfm")))
	require.NoError(t, err)
	require.Equal(t, "3", tfm)
	selected, err := chromedp.Run(ctx, chromedp.Value(chromedp.ID("algorithm")))
	require.NoError(t, err)
	require.Equal(t, api.AlgorithmDynamic, api.Algorithm(selected))

	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.Greater(t, len(shot), 1000)
	shotPath := filepath.Join(t.TempDir(), "admin.png")
	require.NoError(t, os.WriteFile(shotPath, shot, 0o644))
	if dir := os.Getenv("HARVEST_TEST_SCREENSHOT_DIR"); dir != "" {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "admin.png"), shot, 0o644))
	}

	// Sign out, then sign in with a tenant's token: a tenant session on
	// its runs, with nothing of the configuration shown.
	require.NoError(t, clickAndLoad(ctx, "signout"))
	require.NoError(t, chromedp.Do(ctx,
		chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), "acme-secret"),
	))
	require.NoError(t, clickAndLoad(ctx, "signin"))
	require.NoError(t, chromedp.Do(ctx, chromedp.WaitVisible(chromedp.ID("run-filter"))))
	html, err := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("html")))
	require.NoError(t, err)
	require.Contains(t, html, `id="session-tenant">acme<`)
	require.NotContains(t, html, `id="nav-admission"`)
	require.NotContains(t, html, `id="nav-queues"`)
	require.NotContains(t, html, "Max Workflow Runs")
	require.NotContains(t, html, "Dynamic")
}
