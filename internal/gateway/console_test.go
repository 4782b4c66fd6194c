package gateway

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/auth"
	"github.com/harvest-run/harvest/pkg/api"
)

// The console's pages and their tests are in internal/console; these
// helpers and TestConsoleMounted check what the gateway adds: the mount at
// /admin and the body cap in front of it (bodies_test.go).

// The console's cookies (internal/console).
const (
	sessionCookie = "harvest_admin"
	loginCookie   = "harvest_admin_login"
)

// Secrets of the console tests' tokens.
const (
	consoleAcme = "console-acme" // acme: runs:start, runs:read
	consoleRoot = "console-root" // operator: config:*, weights:*
)

func consoleTokens(t *testing.T) *auth.TokenSet {
	t.Helper()
	set, err := auth.ParseTokens([]byte("[" + strings.Join([]string{
		entry("acme-ci", consoleAcme, "acme", "runs:start", "runs:read"),
		entry("root", consoleRoot, "", "config:read", "config:write", "weights:read", "weights:write"),
	}, ",") + "]"))
	require.NoError(t, err)
	return set
}

// browser is an HTTP client with cookies that does not follow redirects.
type browser struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func newBrowser(t *testing.T, base string) *browser {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &browser{t: t, base: base, hc: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

func (br *browser) get(path string) (int, string) {
	resp, err := br.hc.Get(br.base + path)
	require.NoError(br.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(br.t, err)
	return resp.StatusCode, string(b)
}

func (br *browser) post(path string, form url.Values) (int, string, string) {
	resp, err := br.hc.PostForm(br.base+path, form)
	require.NoError(br.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(br.t, err)
	return resp.StatusCode, resp.Header.Get("Location"), string(b)
}

var csrfRe = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func csrfOf(t *testing.T, page string) string {
	t.Helper()
	m := csrfRe.FindStringSubmatch(page)
	require.NotNil(t, m, page)
	return m[1]
}

// signIn signs a fresh browser in with secret and returns it with the
// redirect of the sign-in.
func signIn(t *testing.T, b *bundle, secret string) (*browser, string) {
	t.Helper()
	br := newBrowser(t, b.srv.URL)
	_, page := br.get("/admin")
	status, loc, page := br.post("/admin/login", url.Values{"token": {secret}, "csrf": {csrfOf(t, page)}})
	require.Equal(t, http.StatusSeeOther, status, page)
	return br, loc
}

// The gateway serves the console at /admin with the pages' own routes (so
// that a span is named by its page's route, as TracedHandler names it),
// and answers what the console does not serve under /admin as it answers
// any unknown route: 404 with the API's error body.
func TestConsoleMounted(t *testing.T) {
	t.Parallel()
	b := setup(t, setupOpts{Tokens: consoleTokens(t)})
	br, loc := signIn(t, b, consoleRoot)
	require.Equal(t, "/admin", loc)
	status, page := br.get("/admin")
	require.Equal(t, http.StatusOK, status, page)
	require.Contains(t, page, "Max Workflow Runs")
	csrf := csrfOf(t, page)

	// The route each request matched, as TracedHandler reads it.
	h := b.gw.Handler()
	admin, err := url.Parse(b.srv.URL + "/admin")
	require.NoError(t, err)
	serve := func(method, path string, form url.Values) (*httptest.ResponseRecorder, string) {
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		req := httptest.NewRequest(method, path, body)
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		for _, c := range br.hc.Jar.Cookies(admin) {
			req.AddCookie(c)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec, req.Pattern
	}
	for _, c := range []struct {
		method, path string
		form         url.Values
		status       int
		pattern      string
	}{
		{"GET", "/admin", nil, http.StatusOK, "GET /admin"},
		{"GET", "/admin/", nil, http.StatusOK, "GET /admin/{$}"},
		{"GET", "/admin/runs", nil, http.StatusOK, "GET /admin/runs"},
		{"GET", "/admin/runs/acme/r1", nil, http.StatusNotFound, "GET /admin/runs/{tenant}/{id}"},
		{"GET", "/admin/queues/q", nil, http.StatusOK, "GET /admin/queues/{queue}"},
		{"POST", "/admin/queues/q/pause", url.Values{"csrf": {csrf}}, http.StatusSeeOther, "POST /admin/queues/{queue}/pause"},
		{"GET", "/admin/nothing", nil, http.StatusNotFound, "/"},
		{"DELETE", "/admin/login", nil, http.StatusNotFound, "/"},
		{"GET", "/adminx", nil, http.StatusNotFound, "/"},
	} {
		rec, pattern := serve(c.method, c.path, c.form)
		require.Equal(t, c.status, rec.Code, "%s %s: %s", c.method, c.path, rec.Body)
		require.Equal(t, c.pattern, pattern, "%s %s", c.method, c.path)
		switch {
		case pattern == "/":
			require.Equal(t, api.CodeNotFound, apiErr(t, rec.Body.Bytes()).Code, "%s %s", c.method, c.path)
		case rec.Code != http.StatusSeeOther:
			require.Contains(t, rec.Header().Get("Content-Security-Policy"), "default-src 'none'", "%s %s: a page", c.method, c.path)
		}
	}
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM queue_pauses WHERE queue = 'q'`), "the pause went through the gateway")
}
