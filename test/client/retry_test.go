package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/internal/testsvc"
	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/client"
)

func TestMain(m *testing.M) { testsvc.Main(m) }

const secret = "acme-secret"

// startGateway runs a gateway over one shard with a token for acme and
// returns its HTTP URL.
func startGateway(t *testing.T) string {
	t.Helper()
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	require.NoError(t, os.WriteFile(tokens, []byte(fmt.Sprintf(
		`[{"name":"acme-ci","tenant":"acme","sha256":%q,"privileges":["runs:start","runs:read"]}]`,
		auth.HashSecret(secret))), 0o600))
	cfg := gateway.DefaultConfig([]string{testsvc.NewDBURL(t)}, testsvc.NATSURL(t))
	cfg.Addr = "127.0.0.1:0"
	cfg.TokensFile = tokens
	require.NoError(t, cfg.Validate())
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- gateway.Run(ctx, cfg, gateway.RunOptions{
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Ready:  func(addr string) { ready <- addr },
		})
	}()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	select {
	case addr := <-ready:
		return "http://" + addr
	case err := <-done:
		t.Fatalf("gateway did not start: %v", err)
		return ""
	}
}

// losingTransport delivers the first start to the gateway and then loses
// its answer, as a connection reset after the request went out would.
type losingTransport struct {
	lost atomic.Bool
}

func (lt *losingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err == nil && r.Method == http.MethodPost && lt.lost.CompareAndSwap(false, true) {
		resp.Body.Close()
		return nil, errors.New("connection reset by peer")
	}
	return resp, err
}

// A start whose answer is lost is sent again under the id the client gave
// it, and the gateway replays the run: one run, not two.
func TestRetriedStartReplaysItsRun(t *testing.T) {
	t.Parallel()
	url := startGateway(t)
	lt := &losingTransport{}
	c, err := client.New(client.Options{URL: url, Token: secret, HTTPClient: &http.Client{Transport: lt},
		Retry: &client.RetryPolicy{MaxAttempts: 3, MaxDelay: 50 * time.Millisecond}})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	st, err := c.Start(ctx, "resize", "images", map[string]string{"src": "a.png"}, client.StartOptions{})
	require.NoError(t, err)
	require.True(t, lt.lost.Load(), "the first answer was lost")
	require.False(t, st.Created, "the retry replayed the run the first attempt made")
	require.NotEmpty(t, st.Run.ID)

	list, err := c.List(ctx, client.ListOptions{Queue: "images"})
	require.NoError(t, err)
	require.Len(t, list.Runs, 1)
	require.Equal(t, st.Run.ID, list.Runs[0].ID)
}

// The gateway's refusals match the client's sentinels.
func TestGatewayRefusalsMatchSentinels(t *testing.T) {
	t.Parallel()
	url := startGateway(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(client.Options{URL: url, Token: secret})
	require.NoError(t, err)

	_, err = c.Get(ctx, "no-such-run")
	require.ErrorIs(t, err, client.ErrNotFound)

	_, err = c.Start(ctx, "resize", "images", nil, client.StartOptions{ID: "same"})
	require.NoError(t, err)
	_, err = c.Start(ctx, "resize", "other-queue", nil, client.StartOptions{ID: "same"})
	require.ErrorIs(t, err, client.ErrConflict, "same id, different request")

	_, err = c.Start(ctx, "", "images", nil, client.StartOptions{})
	require.ErrorIs(t, err, client.ErrInvalid)

	bad, err := client.New(client.Options{URL: url, Token: "wrong"})
	require.NoError(t, err)
	_, err = bad.Get(ctx, "r1")
	require.ErrorIs(t, err, client.ErrUnauthorized)

	_, err = c.Admission(ctx)
	require.ErrorIs(t, err, client.ErrForbidden, "a tenant token lacks config:read")
	var ae *api.Error
	require.ErrorAs(t, err, &ae)
	require.True(t, strings.Contains(ae.Error(), string(ae.Code)))
}
