package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/console"
)

// countingListener counts every byte the server reads from its
// connections: what a client made the gateway read.
type countingListener struct {
	net.Listener
	read atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, read: &l.read}, nil
}

type countingConn struct {
	net.Conn
	read *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// hugeBody is what the tests offer: 40 MB, far past every cap.
const hugeBody = 40 << 20

// rawPost sends a request of size bytes of a form on a connection of its own
// (declared with Content-Length, or chunked) and reads the answer while
// the body is still being written, as an attacker's client would. It
// returns the answer and the bytes the server read meanwhile.
func rawPost(t *testing.T, srv *httptest.Server, ln *countingListener, route string, header http.Header, size int, chunked bool) (*http.Response, int64) {
	t.Helper()
	before := ln.read.Load()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
	var h strings.Builder
	method, path, ok := strings.Cut(route, " ")
	if !ok {
		method, path = "POST", route
	}
	fmt.Fprintf(&h, "%s %s HTTP/1.1\r\nHost: gw\r\n", method, path)
	if chunked {
		h.WriteString("Transfer-Encoding: chunked\r\n")
	} else {
		fmt.Fprintf(&h, "Content-Length: %d\r\n", size)
	}
	if header.Get("Content-Type") == "" {
		h.WriteString("Content-Type: application/x-www-form-urlencoded\r\n")
	}
	for k, vs := range header {
		for _, v := range vs {
			fmt.Fprintf(&h, "%s: %s\r\n", k, v)
		}
	}
	h.WriteString("\r\n")
	_, err = io.WriteString(c, h.String())
	require.NoError(t, err)

	var wg sync.WaitGroup
	wg.Go(func() {
		// Write errors are expected: the server closes the connection
		// once it has answered.
		chunk := []byte("csrf=" + strings.Repeat("x", 64<<10-5))
		for sent := 0; sent < size; sent += len(chunk) {
			if chunked {
				if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(chunk), chunk); err != nil {
					return
				}
				continue
			}
			if _, err := c.Write(chunk[:min(len(chunk), size-sent)]); err != nil {
				return
			}
		}
		if chunked {
			_, _ = io.WriteString(c, "0\r\n\r\n")
		}
	})
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err, "no answer to %s", path)
	resp.Body.Close()
	read := ln.read.Load() - before
	c.Close()
	wg.Wait()
	return resp, read
}

// Every route caps its body before anything reads it: a 40 MB POST to each
// console form and to API routes, without credentials, is refused (413 at
// once when its length is declared, else 401 or 403 before the body is
// read) and the gateway reads a few KB of it at most; with a session, or a
// token, the gateway reads no more than the route's cap (16 KB on the
// console, HARVEST_GATEWAY_MAX_BODY_BYTES on the API) before its 413. Each
// refusal closes the connection rather than drain the body. A multipart
// body is refused on the console, session or not.
func TestBodiesCappedBeforeRead(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{Tokens: consoleTokens(t), MaxBodyBytes: 64 << 10})
	ln := &countingListener{}
	srv := httptest.NewUnstartedServer(b.gw.Handler())
	ln.Listener = srv.Listener
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	// slack is what the server may read besides the body it takes: the
	// request's header block and a buffer's worth (4 KB) read with it.
	const slack = 8 << 10

	// A session (an operator's) and a sign-in form's cookie.
	br, _ := signIn(t, b, consoleRoot)
	base, err := url.Parse(b.srv.URL + "/admin")
	require.NoError(t, err)
	var session string
	for _, c := range br.hc.Jar.Cookies(base) {
		if c.Name == sessionCookie {
			session = c.Value
		}
	}
	require.NotEmpty(t, session)
	fresh := newBrowser(t, b.srv.URL)
	fresh.get("/admin")
	var login string
	for _, c := range fresh.hc.Jar.Cookies(base) {
		if c.Name == loginCookie {
			login = c.Value
		}
	}
	require.NotEmpty(t, login)

	forms := []string{
		"/admin/login", "/admin/admission", "/admin/logout",
		"/admin/runs/acme/r1/cancel", "/admin/runs/acme/r1/retry",
		"/admin/queues/q/pause", "/admin/queues/q/resume",
		"/admin/queues/q/fairness", "/admin/queues/q/group-weights",
	}
	check := func(what string, resp *http.Response, read int64, statuses []int, limit int64) {
		t.Helper()
		require.Contains(t, statuses, resp.StatusCode, what)
		require.True(t, resp.Close, "%s: the refusal closes the connection", what)
		require.Less(t, read, limit+slack, "%s: the gateway read %d bytes", what, read)
	}
	for _, path := range forms {
		resp, read := rawPost(t, srv, ln, path, nil, hugeBody, false)
		check(path+" declared", resp, read, []int{http.StatusRequestEntityTooLarge}, 0)
		resp, read = rawPost(t, srv, ln, path, nil, hugeBody, true)
		check(path+" chunked, no session", resp, read, []int{http.StatusUnauthorized, http.StatusForbidden}, 0)
		cookie := http.Header{"Cookie": {sessionCookie + "=" + session}}
		if path == "/admin/login" {
			cookie = http.Header{"Cookie": {loginCookie + "=" + login}}
		}
		resp, read = rawPost(t, srv, ln, path, cookie, hugeBody, true)
		check(path+" chunked, signed in", resp, read, []int{http.StatusRequestEntityTooLarge}, console.MaxFormBytes)
	}

	api := []string{"/v1/runs", "/v1/runs/batch", "/v1/runs/r1/cancel", "/v1/runs/r1/retry", "PUT /v1/admission",
		"/v1/queues/q/pause", "PUT /v1/queues/q/weights/k", "PUT /v1/queues/q/fairness", "/v1/nothing-here"}
	for _, route := range api {
		resp, read := rawPost(t, srv, ln, route, nil, hugeBody, false)
		check(route+" declared, no token", resp, read, []int{http.StatusUnauthorized, http.StatusNotFound}, 0)
		resp, read = rawPost(t, srv, ln, route, nil, hugeBody, true)
		check(route+" chunked, no token", resp, read, []int{http.StatusUnauthorized, http.StatusNotFound}, 0)
	}
	bearer := http.Header{"Authorization": {"Bearer " + consoleAcme}, "Content-Type": {"application/json"}}
	resp, read := rawPost(t, srv, ln, "/v1/runs", bearer, hugeBody, false)
	check("/v1/runs declared, token", resp, read, []int{http.StatusRequestEntityTooLarge}, 0)
	resp, read = rawPost(t, srv, ln, "/v1/runs", bearer, hugeBody, true)
	check("/v1/runs chunked, token", resp, read, []int{http.StatusRequestEntityTooLarge}, b.gw.cfg.MaxBodyBytes)

	// Multipart is refused on the console, even a small and otherwise
	// valid form of a signed-in operator: nothing changes.
	page := func() string { _, p := br.get("/admin/queues/q"); return p }
	csrf := csrfOf(t, page())
	body := "--XX\r\nContent-Disposition: form-data; name=\"csrf\"\r\n\r\n" + csrf +
		"\r\n--XX\r\nContent-Disposition: form-data; name=\"group\"\r\n\r\ng1" +
		"\r\n--XX\r\nContent-Disposition: form-data; name=\"weight\"\r\n\r\n7\r\n--XX--\r\n"
	for _, cookie := range []string{"", sessionCookie + "=" + session} {
		req, err := http.NewRequest("POST", srv.URL+"/admin/queues/q/group-weights", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "multipart/form-data; boundary=XX")
		if cookie != "" {
			req.Header.Set("Cookie", cookie)
		}
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusUnsupportedMediaType, resp.StatusCode)
	}
	require.NotContains(t, page(), "g1 = 7", "the multipart form changed nothing")
}
