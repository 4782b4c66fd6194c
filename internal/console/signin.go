package console

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/harvest-run/harvest/internal/auth"
)

// Signing in and out. A browser signs in with a bearer token of the tokens
// file; the session (session.go) keeps the token on the server and
// authenticates it again on every request.

// signIn shows the sign-in form with a fresh CSRF value, which this
// console signed and which must also come back in a cookie (double
// submit).
func (c *Console) signIn(w http.ResponseWriter, r *http.Request, status int, msg string) {
	csrf := c.sessions.issueLogin()
	c.setCookie(w, r, loginCookie, csrf, int(loginTTL/time.Second))
	c.render(w, status, "signin", pageData{Title: "Sign in", CSRF: csrf, Error: msg})
}

// current returns the request's live session and its principal. A session
// whose token no longer authenticates is ended. ok is false when there is
// no usable session.
func (c *Console) current(r *http.Request) (*session, auth.Principal, bool) {
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return nil, auth.Principal{}, false
	}
	sess, ok := c.sessions.get(ck.Value)
	if !ok {
		return nil, auth.Principal{}, false
	}
	p, err := c.be.Authenticate(sess.secret)
	if err != nil {
		c.sessions.remove(sess.id)
		return nil, auth.Principal{}, false
	}
	return sess, p, true
}

// pageAdmin is GET /admin: the sign-in form without a session, the
// admission page for an operator, and a tenant's runs for a tenant.
func (c *Console) pageAdmin(w http.ResponseWriter, r *http.Request) {
	sess, p, ok := c.current(r)
	if !ok {
		msg := ""
		if _, err := r.Cookie(sessionCookie); err == nil {
			msg = "Your session has ended; sign in again."
			c.setCookie(w, r, sessionCookie, "", -1)
		}
		c.signIn(w, r, http.StatusOK, msg)
		return
	}
	switch roleOf(p) {
	case roleTenant:
		// A tenant's session has no admission page: its page is its runs.
		http.Redirect(w, r, "/admin/runs", http.StatusSeeOther)
		return
	case roleNone:
		c.sessions.remove(sess.id)
		c.setCookie(w, r, sessionCookie, "", -1)
		c.refused(w, fmt.Sprintf("Token %q lacks the config:read privilege, and is not a tenant's token with runs:read.", p.Name))
		return
	}
	c.dashboard(w, r, http.StatusOK, sess, p, r.URL.Query().Get("saved") == "1", "", nil)
}

// pageLogin signs a browser in. The sign-in form's signed value is checked
// in its cookie before the body is read, so a caller that did not load the
// form from this console gets its 403 without sending a byte of its body.
func (c *Console) pageLogin(w http.ResponseWriter, r *http.Request) {
	ck, err := r.Cookie(loginCookie)
	if err != nil || !c.sessions.checkLogin(ck.Value) {
		c.signIn(w, r, http.StatusForbidden, "The sign-in form expired or did not come from this page; try again.")
		return
	}
	if !c.parseForm(w, r) {
		return
	}
	if !sameToken(r.PostForm.Get("csrf"), ck.Value) {
		c.signIn(w, r, http.StatusForbidden, "The sign-in form expired or did not come from this page; try again.")
		return
	}
	secret := strings.TrimSpace(r.PostForm.Get("token"))
	p, err := c.be.Authenticate(secret)
	if secret == "" || err != nil {
		c.signIn(w, r, http.StatusUnauthorized, "Unknown token.")
		return
	}
	rl := roleOf(p)
	if rl == roleNone {
		c.setCookie(w, r, loginCookie, "", -1)
		c.refused(w, fmt.Sprintf("Token %q lacks the config:read privilege, and is not a tenant's token with runs:read: the console is for operators and tenants only.", p.Name))
		return
	}
	sess, retry, err := c.sessions.create(secret, sessionOwner{operator: rl == roleOperator, principal: p.Name}, c.limits)
	if err != nil {
		secs := max(int64((retry+time.Second-1)/time.Second), 1)
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
		if errors.Is(err, errSignInPace) {
			c.signIn(w, r, http.StatusTooManyRequests, fmt.Sprintf("Token %q signed in too often lately; try again in %d seconds.", p.Name, secs))
			return
		}
		c.signIn(w, r, http.StatusServiceUnavailable, fmt.Sprintf("This gateway holds as many console sessions as it can; try again in %d seconds.", secs))
		return
	}
	c.setCookie(w, r, loginCookie, "", -1)
	c.setCookie(w, r, sessionCookie, sess.id, int(c.ttl/time.Second))
	if rl == roleTenant {
		http.Redirect(w, r, "/admin/runs", http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, "/admin", http.StatusSeeOther)
}

// postSession checks the session and the CSRF token of a signed-in form.
// The session, which is in the cookie, is checked before the form is read:
// a caller without one gets its 401 page without the console reading its
// body.
func (c *Console) postSession(w http.ResponseWriter, r *http.Request) (*session, auth.Principal, bool) {
	sess, p, ok := c.current(r)
	if !ok {
		c.setCookie(w, r, sessionCookie, "", -1)
		c.signIn(w, r, http.StatusUnauthorized, "Your session has ended; sign in again.")
		return nil, auth.Principal{}, false
	}
	if !c.parseForm(w, r) {
		return nil, auth.Principal{}, false
	}
	if !sameToken(r.PostForm.Get("csrf"), sess.csrf) {
		c.refused(w, "The form did not come from this session (CSRF check failed); reload the page and try again.")
		return nil, auth.Principal{}, false
	}
	return sess, p, true
}

func (c *Console) pageLogout(w http.ResponseWriter, r *http.Request) {
	sess, _, ok := c.postSession(w, r)
	if !ok {
		return
	}
	c.sessions.remove(sess.id)
	c.setCookie(w, r, sessionCookie, "", -1)
	http.Redirect(w, r, "/admin", http.StatusSeeOther)
}
