package gateway

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/internal/testsvc"
)

// serveReal runs the gateway's own Server (its timeouts) on a real
// listener, with short timeouts so that the test does not wait long.
func serveReal(t *testing.T) string {
	t.Helper()
	cfg := DefaultConfig([]string{testsvc.NewDBURL(t)}, testsvc.NATSURL(t))
	cfg.MaxRuns = 1_000_000
	cfg.ReadHeaderTimeout = 200 * time.Millisecond
	cfg.ReadTimeout = 500 * time.Millisecond
	// Long enough that a loaded machine still reads and writes a long
	// poll's answer within it once the wait is over.
	cfg.WriteTimeout = 2 * time.Second
	cfg.IdleTimeout = 500 * time.Millisecond
	require.NoError(t, cfg.Validate())
	g, err := New(Options{Config: cfg, Tokens: auth.NewStore(testTokens(t)),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	require.NoError(t, err)
	srv := g.Server()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); g.Close() })
	return ln.Addr().String()
}

// closedByServer reports how the server ended a connection that the client
// leaves hanging: the answer it wrote, if any, then EOF. The client's own
// deadline only bounds a failing test.
func closedByServer(t *testing.T, c net.Conn) string {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
	b, err := io.ReadAll(c)
	var ne net.Error
	if err != nil && errorsAs(err, &ne) && ne.Timeout() {
		t.Fatalf("the server kept the connection open (read so far: %q)", b)
	}
	return string(b)
}

func errorsAs(err error, target *net.Error) bool {
	ne, ok := err.(net.Error)
	if ok {
		*target = ne
	}
	return ok
}

// Slow clients lose their connection: one that never finishes its headers,
// one that sends one byte of a body it announced (with no token, or with a
// valid one), and an idle keep-alive one. A long poll outlasts the write
// timeout by its wait.
func TestSlowClientsLoseTheirConnection(t *testing.T) {
	t.Parallel()
	addr := serveReal(t)
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}

	t.Run("headers never finished", func(t *testing.T) {
		c := dial()
		_, err := io.WriteString(c, "POST /v1/runs HTTP/1.1\r\nHost: x\r\n")
		require.NoError(t, err)
		closedByServer(t, c)
	})
	for _, token := range []string{"", secretA} {
		t.Run(fmt.Sprintf("body trickle, token %t", token != ""), func(t *testing.T) {
			c := dial()
			h := "POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n"
			if token != "" {
				h += "Authorization: Bearer " + token + "\r\n"
			}
			_, err := io.WriteString(c, h+"\r\n{")
			require.NoError(t, err)
			out := closedByServer(t, c)
			if token == "" {
				require.Contains(t, out, "401", "refused without waiting for the body")
			}
		})
	}
	t.Run("idle keep-alive", func(t *testing.T) {
		c := dial()
		_, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
		closedByServer(t, c)
	})
	t.Run("long poll outlasts the write timeout", func(t *testing.T) {
		do := func(method, path, body string) (int, string) {
			req, err := http.NewRequest(method, "http://"+addr+path, strings.NewReader(body))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer "+secretA)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			out, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			resp.Body.Close()
			return resp.StatusCode, string(out)
		}
		status, out := do("POST", "/v1/runs", `{"id":"poll","name":"echo","queue":"nobody-serves-it"}`)
		require.Equal(t, 201, status, out)
		// No worker serves the queue: the answer comes when the wait,
		// three times the write timeout, is over.
		status, out = do("GET", "/v1/runs/poll?wait=6s", "")
		require.Equal(t, 200, status, out)
		require.Contains(t, out, `"queued"`)
	})
}
