package gateway

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maxSessions bounds the sessions one gateway keeps; signing in beyond it
// drops the session closest to expiry.
const maxSessions = 10000

// session is one browser signed in to /admin. It lives only in the memory
// of the gateway that made it (see docs/admission.md): behind a load
// balancer, route /admin to one gateway or use sticky sessions; a browser
// that reaches another gateway is asked to sign in again.
type session struct {
	id string
	// secret is the bearer token the browser signed in with. It stays on
	// the server and is authenticated again on every request, so a token
	// removed from the tokens file (or losing config:read) ends the
	// session at once.
	secret  string
	csrf    string
	expires time.Time
}

// sessionStore holds the sessions of the /admin page with an absolute
// expiry: a session ends ttl after sign-in, whatever the activity.
type sessionStore struct {
	ttl time.Duration
	now func() time.Time
	// loginKey signs the sign-in form's CSRF values, so that only values
	// this gateway issued (and recently) are accepted: a cookie and form
	// field of the caller's own choosing are not.
	loginKey []byte

	mu       sync.Mutex
	sessions map[string]*session
}

func newSessionStore(ttl time.Duration, now func() time.Time) *sessionStore {
	if ttl <= 0 {
		ttl = 30 * time.Minute
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	return &sessionStore{ttl: ttl, now: now, loginKey: key, sessions: map[string]*session{}}
}

// loginTTL is how long a sign-in form stays valid.
const loginTTL = 10 * time.Minute

// issueLogin returns a fresh CSRF value for the sign-in form: a random
// nonce and an expiry, signed with the store's key.
func (s *sessionStore) issueLogin() string {
	body := randomToken() + "." + strconv.FormatInt(s.now().Add(loginTTL).Unix(), 10)
	return body + "." + s.loginMAC(body)
}

// checkLogin reports whether v is a value issueLogin made and that has
// not expired.
func (s *sessionStore) checkLogin(v string) bool {
	i := strings.LastIndexByte(v, '.')
	if i < 0 {
		return false
	}
	body, mac := v[:i], v[i+1:]
	if !sameToken(mac, s.loginMAC(body)) {
		return false
	}
	_, exp, ok := strings.Cut(body, ".")
	if !ok {
		return false
	}
	unix, err := strconv.ParseInt(exp, 10, 64)
	return err == nil && s.now().Before(time.Unix(unix, 0))
}

func (s *sessionStore) loginMAC(body string) string {
	m := hmac.New(sha256.New, s.loginKey)
	m.Write([]byte(body))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// randomToken is 32 bytes from the system's CSPRNG, base64url-encoded.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b)
}

// create starts a session for secret with a fresh id and CSRF token.
func (s *sessionStore) create(secret string) *session {
	now := s.now()
	sess := &session{id: randomToken(), secret: secret, csrf: randomToken(), expires: now.Add(s.ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, old := range s.sessions {
		if !now.Before(old.expires) {
			delete(s.sessions, id)
		}
	}
	if len(s.sessions) >= maxSessions {
		var oldest *session
		for _, old := range s.sessions {
			if oldest == nil || old.expires.Before(oldest.expires) {
				oldest = old
			}
		}
		delete(s.sessions, oldest.id)
	}
	s.sessions[sess.id] = sess
	return sess
}

// get returns the live session of id; an expired one is dropped.
func (s *sessionStore) get(id string) (*session, bool) {
	if id == "" {
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sess, ok := s.sessions[id]
	if !ok {
		return nil, false
	}
	if !s.now().Before(sess.expires) {
		delete(s.sessions, id)
		return nil, false
	}
	return sess, true
}

// remove ends a session (sign-out).
func (s *sessionStore) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.sessions, id)
}

// sameToken compares two tokens in constant time.
func sameToken(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}
