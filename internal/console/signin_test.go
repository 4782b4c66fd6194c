package console_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/harvest-run/harvest/internal/console"
	"github.com/harvest-run/harvest/internal/gateway"
	"github.com/harvest-run/harvest/pkg/api"
)

// The /admin page: sign-in with CSRF, refusal of a token without
// config:read that is no tenant's (nothing shown), a tenant's token sent
// to its runs, saving through the PUT /v1/admission path
// (audited with the token's name), CSRF checked on every form, session
// expiry on the injected clock, sign-out, and the cookie's attributes.
func TestAdminPageSessions(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)}
	b := serve(t, siteOpts{Now: clock.Now})
	br := newBrowser(t, b.srv.URL)

	status, page := br.get("/admin")
	require.Equal(t, 200, status)
	require.Contains(t, page, `action="/admin/login"`)
	require.NotContains(t, page, "Max Workflow Runs")
	require.NotEmpty(t, csrfOf(t, page))

	// Without the form's CSRF value: refused.
	status, _, page = br.post("/admin/login", url.Values{"token": {consoleRoot}, "csrf": {"forged"}})
	require.Equal(t, 403, status)
	require.NotContains(t, page, "Max Workflow Runs")
	login := csrfOf(t, page)

	// An administrator without config:read: refused, nothing of the
	// configuration shown, no session.
	status, _, page = br.post("/admin/login", url.Values{"token": {consoleNobody}, "csrf": {login}})
	require.Equal(t, 403, status, page)
	require.Contains(t, page, "lacks the config:read privilege")
	require.NotContains(t, page, "Max Workflow Runs")
	require.NotContains(t, page, "Algorithm")
	status, page = br.get("/admin")
	require.Equal(t, 200, status)
	require.Contains(t, page, `action="/admin/login"`)
	login = csrfOf(t, page)

	// A tenant's token gets a tenant session in its own browser: GET
	// /admin sends it to its runs, and nothing of the configuration
	// shows.
	tb := newBrowser(t, b.srv.URL)
	_, page = tb.get("/admin")
	status, loc, page := tb.post("/admin/login", url.Values{"token": {consoleAcme}, "csrf": {csrfOf(t, page)}})
	require.Equal(t, 303, status, page)
	require.Equal(t, "/admin/runs", loc)
	resp, err := tb.hc.Get(b.srv.URL + "/admin")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 303, resp.StatusCode)
	require.Equal(t, "/admin/runs", resp.Header.Get("Location"))
	status, page = tb.get("/admin/runs")
	require.Equal(t, 200, status, page)
	require.Contains(t, page, "tenant <strong id=\"session-tenant\">acme</strong>")
	require.NotContains(t, page, "Max Workflow Runs")
	require.NotContains(t, page, "Algorithm")
	status, _, page = tb.post("/admin/admission", url.Values{"algorithm": {"dynamic"}, "tfm": {"3"}, "csrf": {csrfOf(t, page)}})
	require.Equal(t, 403, status)
	require.NotContains(t, page, "Max Workflow Runs")
	require.Equal(t, api.AlgorithmNoLimit, b.admission(t).Algorithm)
	status, _, page = br.post("/admin/login", url.Values{"token": {"nope"}, "csrf": {login}})
	require.Equal(t, 401, status)
	require.Contains(t, page, "Unknown token")
	login = csrfOf(t, page)

	// The administrator signs in.
	resp, err = br.hc.PostForm(b.srv.URL+"/admin/login", url.Values{"token": {consoleRoot}, "csrf": {login}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 303, resp.StatusCode)
	var cookie *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == console.SessionCookie {
			cookie = c
		}
	}
	require.NotNil(t, cookie)
	require.True(t, cookie.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, cookie.SameSite)
	require.Equal(t, 1800, cookie.MaxAge)
	require.NotContains(t, cookie.Value, consoleRoot)

	status, page = br.get("/admin")
	require.Equal(t, 200, status)
	for _, s := range []string{"Max Workflow Runs", `value="128" readonly`, "No-Limit", "Static", "Dynamic", "TFM", "signed in as <strong>root</strong>", "Running per tenant", "Weight overrides", "Latest audit rows"} {
		require.Contains(t, page, s)
	}
	csrf := csrfOf(t, page)

	// Saving with a wrong CSRF token changes nothing.
	status, _, _ = br.post("/admin/admission", url.Values{"algorithm": {"dynamic"}, "tfm": {"3"}, "csrf": {"wrong"}})
	require.Equal(t, 403, status)
	require.Equal(t, api.AlgorithmNoLimit, b.admission(t).Algorithm)

	// A bad TFM is refused (400) with the typed values kept.
	status, _, page = br.post("/admin/admission", url.Values{"algorithm": {"dynamic"}, "tfm": {"-2"}, "csrf": {csrf}})
	require.Equal(t, 400, status)
	require.Contains(t, page, "tfm must be a positive finite number")
	require.Contains(t, page, `value="-2"`)

	status, loc, _ = br.post("/admin/admission", url.Values{"algorithm": {"dynamic"}, "tfm": {"3"}, "csrf": {csrf}})
	require.Equal(t, 303, status)
	require.Equal(t, "/admin?saved=1", loc)
	status, page = br.get(loc)
	require.Equal(t, 200, status)
	require.Contains(t, page, "Saved: algorithm Dynamic, TFM 3")
	require.Contains(t, page, `<option value="dynamic" selected>Dynamic</option>`)
	view := b.admission(t)
	require.Equal(t, api.AlgorithmDynamic, view.Algorithm)
	require.Equal(t, 3.0, view.TFM)
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM audit WHERE action = 'admission.set' AND actor = 'root' AND outcome = 'ok'`))
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM audit WHERE action = 'admission.set' AND actor = 'root' AND outcome = 'refused'`))

	// The session ends 30 minutes after sign-in.
	clock.Add(29 * time.Minute)
	status, page = br.get("/admin")
	require.Equal(t, 200, status)
	require.Contains(t, page, "Max Workflow Runs")
	clock.Add(2 * time.Minute)
	status, page = br.get("/admin")
	require.Equal(t, 200, status)
	require.Contains(t, page, "Your session has ended")
	require.NotContains(t, page, "Max Workflow Runs")
	status, _, page = br.post("/admin/admission", url.Values{"algorithm": {"static"}, "tfm": {"1"}, "csrf": {csrf}})
	require.Equal(t, 401, status)
	require.Contains(t, page, `action="/admin/login"`)
	require.Equal(t, api.AlgorithmDynamic, b.admission(t).Algorithm)

	// Sign in again (ops-ro: config:read, no config:write), then sign out.
	login = csrfOf(t, page)
	status, _, _ = br.post("/admin/login", url.Values{"token": {consoleOpsRead}, "csrf": {login}})
	require.Equal(t, 303, status)
	status, page = br.get("/admin")
	require.Equal(t, 200, status)
	csrf = csrfOf(t, page)
	// Without config:write, saving is refused and audited.
	status, _, page = br.post("/admin/admission", url.Values{"algorithm": {"static"}, "tfm": {"1"}, "csrf": {csrf}})
	require.Equal(t, 403, status)
	require.Contains(t, page, "lacks the config:write privilege")
	require.Equal(t, 1, b.count(t, 0, `SELECT count(*) FROM audit WHERE actor = 'ops-ro' AND outcome = 'refused'`))
	status, _, _ = br.post("/admin/logout", url.Values{"csrf": {"wrong"}})
	require.Equal(t, 403, status, "sign-out checks CSRF too")
	status, loc, _ = br.post("/admin/logout", url.Values{"csrf": {csrf}})
	require.Equal(t, 303, status)
	require.Equal(t, "/admin", loc)
	status, page = br.get("/admin")
	require.Equal(t, 200, status)
	require.Contains(t, page, `action="/admin/login"`)
	require.True(t, strings.Contains(page, "Sign in"))
}

// The sign-in form's CSRF value must be one this gateway issued: a cookie
// and form field of the caller's choosing, however equal, are refused; an
// issued value that expired is refused too.
func TestAdminSignInTakesOnlyIssuedValues(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: time.Now()}
	b := serve(t, siteOpts{Now: clock.Now})
	login := func(cookie, csrf string) *http.Response {
		req, err := http.NewRequest("POST", b.srv.URL+"/admin/login",
			strings.NewReader(url.Values{"token": {consoleRoot}, "csrf": {csrf}}.Encode()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(&http.Cookie{Name: console.LoginCookie, Value: cookie})
		resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		}}).Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	for _, forged := range []string{"forged", "a.1.b", "x." + fmt.Sprint(time.Now().Add(time.Hour).Unix()) + ".sig"} {
		resp := login(forged, forged)
		require.Equal(t, http.StatusForbidden, resp.StatusCode, forged)
		for _, c := range resp.Cookies() {
			require.NotEqual(t, console.SessionCookie, c.Name, "a session from a forged form")
		}
	}
	_, page := newBrowser(t, b.srv.URL).get("/admin")
	issued := csrfOf(t, page)
	clock.Add(console.LoginTTL + time.Second)
	require.Equal(t, http.StatusForbidden, login(issued, issued).StatusCode, "expired")
	_, page = newBrowser(t, b.srv.URL).get("/admin")
	issued = csrfOf(t, page)
	require.Equal(t, http.StatusSeeOther, login(issued, issued).StatusCode)
}

// Cookies are Secure over TLS, behind a proxy that says it terminated TLS,
// or always when so configured.
func TestAdminCookiesSecureBehindAProxy(t *testing.T) {
	t.Parallel()
	b := serve(t, siteOpts{})
	secure := func(g *gateway.Gateway, proto string) bool {
		req := httptest.NewRequest("GET", "http://gw/admin", nil)
		if proto != "" {
			req.Header.Set("X-Forwarded-Proto", proto)
		}
		rec := httptest.NewRecorder()
		g.Handler().ServeHTTP(rec, req)
		cs := rec.Result().Cookies()
		require.NotEmpty(t, cs)
		return cs[0].Secure
	}
	require.False(t, secure(b.gw, ""))
	require.True(t, secure(b.gw, "https"))
	require.False(t, secure(b.gw, "http"))
	cfg := b.cfg
	cfg.CookieSecure = gateway.CookieSecureAlways
	g, err := gateway.New(gateway.Options{Config: cfg, Tokens: b.tokens})
	require.NoError(t, err)
	defer g.Close()
	require.True(t, secure(g, ""))
	cfg.CookieSecure = "sometimes"
	require.ErrorContains(t, cfg.Validate(), "HARVEST_GATEWAY_COOKIE_SECURE")
}

// Sign-ins are paced per token: ten in a row, then 429 with Retry-After
// until the bucket refills, while other tokens sign in as usual. Over
// HTTP, a tenant signing in again and again keeps at most five sessions
// and leaves the operator's session working.
func TestConsoleSignInsPacedAndCapped(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)}
	b := serve(t, siteOpts{Now: clock.Now})
	ops, _ := signIn(t, b, consoleRoot)

	// One sign-in form's value, replayed as a script would.
	_, page := newBrowser(t, b.srv.URL).get("/admin")
	login := csrfOf(t, page)
	h := b.gw.Handler()
	post := func(secret string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/admin/login", strings.NewReader(url.Values{"token": {secret}, "csrf": {login}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(&http.Cookie{Name: console.LoginCookie, Value: login})
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	var sessions []string
	for i := range 10 {
		rec := post(consoleAcme)
		require.Equal(t, http.StatusSeeOther, rec.Code, "sign-in %d", i)
		for _, c := range rec.Result().Cookies() {
			if c.Name == console.SessionCookie && c.Value != "" {
				sessions = append(sessions, c.Value)
			}
		}
	}
	rec := post(consoleAcme)
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	require.Equal(t, "6", rec.Header().Get("Retry-After"))
	require.Contains(t, rec.Body.String(), "signed in too often")
	require.Equal(t, http.StatusSeeOther, post(consoleGlobex).Code, "another token is not held back")
	for range 200 {
		require.Equal(t, http.StatusTooManyRequests, post(consoleAcme).Code)
	}
	clock.Add(6 * time.Second)
	require.Equal(t, http.StatusSeeOther, post(consoleAcme).Code, "the bucket refilled by one")

	require.Len(t, sessions, 10)
	live := 0
	for _, id := range sessions {
		// A live session of a tenant's token goes to its runs; an ended
		// one gets the sign-in form.
		req := httptest.NewRequest("GET", "/admin", nil)
		req.AddCookie(&http.Cookie{Name: console.SessionCookie, Value: id})
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code == http.StatusSeeOther {
			live++
		}
	}
	require.Equal(t, 4, live, "the token keeps its five newest sessions (the last sign-in is the fifth)")
	status, page := ops.get("/admin")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, "Max Workflow Runs", "the operator's session still works")
}
