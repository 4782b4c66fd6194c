package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// poolSessions bounds the sessions of each pool, operators' and
// tenants', that one gateway keeps. The pools are apart so that no tenant,
// however many tokens it holds, can push an operator's session out.
const poolSessions = 10000

// sessionLimits are the per-token bounds of the console's sign-ins
// (HARVEST_GATEWAY_ADMIN_SESSIONS_PER_TOKEN and
// HARVEST_GATEWAY_ADMIN_SIGNINS_PER_MINUTE).
type sessionLimits struct {
	// perPrincipal is how many sessions one token holds at once; signing
	// in again past it ends that token's own oldest session.
	perPrincipal int
	// signInsPerMinute is the pace of a token's sign-ins, with a burst of
	// as many: past it a sign-in is refused, and no session made or ended.
	signInsPerMinute int
}

// session is one browser signed in to /admin. It lives only in the memory
// of the gateway that made it (see docs/console.md): behind a load
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
	// owner is the token (principal) that signed in, in its pool: the
	// unit of the per-token cap.
	owner sessionOwner
}

// sessionOwner names a token in its pool.
type sessionOwner struct {
	operator  bool
	principal string
}

// Refusals of sessionStore.create.
var (
	// errSignInPace: the token signed in too often lately.
	errSignInPace = errors.New("session: too many sign-ins with this token")
	// errSessionsFull: the pool is full and every other token in it
	// holds no more sessions than this one would.
	errSessionsFull = errors.New("session: no room for another session")
)

// sessionStore holds the sessions of the /admin page with an absolute
// expiry: a session ends ttl after sign-in, whatever the activity.
type sessionStore struct {
	ttl time.Duration
	now func() time.Time
	// loginKey signs the sign-in form's CSRF values, so that only values
	// this gateway issued (and recently) are accepted: a cookie and form
	// field of the caller's own choosing are not.
	loginKey []byte
	// poolCap is poolSessions, smaller in tests.
	poolCap int

	mu       sync.Mutex
	sessions map[string]*session
	// owned lists each token's sessions, oldest first.
	owned map[sessionOwner][]*session
	// pooled counts the sessions of each pool (index 1: operators).
	pooled [2]int
	// holding indexes each pool's tokens by how many sessions they
	// hold (holding[pool][n]: the tokens holding n), so that a full pool
	// finds the token holding the most without going through them all.
	holding [2][]map[sessionOwner]struct{}
	// expiry is no later than the first expiry among the sessions, so
	// that a full pool looks for expired sessions only when one may be.
	expiry time.Time
	// paces are the tokens' sign-in buckets.
	paces map[sessionOwner]*signInPace
}

func newSessionStore(ttl time.Duration, now func() time.Time) *sessionStore {
	if ttl <= 0 {
		ttl = 30 * time.Minute
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key) // never fails (crypto/rand)
	return &sessionStore{ttl: ttl, now: now, loginKey: key, poolCap: poolSessions,
		sessions: map[string]*session{}, owned: map[sessionOwner][]*session{}, paces: map[sessionOwner]*signInPace{}}
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

// create starts a session for secret, the token of owner, with a fresh
// id and CSRF token. A token past lim.perPrincipal loses its own oldest
// session. A full pool makes room only at the expense of the token that
// holds the most sessions in it, and only while that one holds at least
// two more than owner would: no token is pushed below another's share, and
// a token already holding its share is refused (errSessionsFull). A token
// signing in faster than lim.signInsPerMinute is refused (errSignInPace);
// retry is then when the next sign-in will be let in.
func (s *sessionStore) create(secret string, owner sessionOwner, lim sessionLimits) (sess *session, retry time.Duration, err error) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if wait := s.pace(owner, now, lim.signInsPerMinute); wait > 0 {
		return nil, wait, errSignInPace
	}
	s.dropExpired(s.owned[owner], now)
	for len(s.owned[owner]) >= max(lim.perPrincipal, 1) {
		s.drop(s.owned[owner][0])
	}
	pool := poolOf(owner)
	if s.pooled[pool] >= s.poolCap && !now.Before(s.expiry) {
		s.expiry = now.Add(s.ttl)
		for _, old := range s.sessions {
			if !now.Before(old.expires) {
				s.drop(old)
			} else if old.expires.Before(s.expiry) {
				s.expiry = old.expires
			}
		}
	}
	if s.pooled[pool] >= s.poolCap {
		most := s.holdingMost(pool)
		if len(most) < len(s.owned[owner])+2 {
			// Every session lives ttl, so room comes no sooner than the
			// first expiry.
			return nil, max(s.expiry.Sub(now), time.Second), errSessionsFull
		}
		s.drop(most[0])
	}
	sess = &session{id: randomToken(), secret: secret, csrf: randomToken(), expires: now.Add(s.ttl), owner: owner}
	if len(s.sessions) == 0 || sess.expires.Before(s.expiry) {
		s.expiry = sess.expires
	}
	s.sessions[sess.id] = sess
	s.setOwned(owner, append(s.owned[owner], sess))
	s.pooled[pool]++
	return sess, 0, nil
}

// holdingMost returns the sessions of a token of pool holding the most
// sessions in it; s.mu is held.
func (s *sessionStore) holdingMost(pool int) []*session {
	for n := len(s.holding[pool]) - 1; n > 0; n-- {
		for o := range s.holding[pool][n] {
			return s.owned[o]
		}
	}
	return nil
}

// setOwned puts list as owner's sessions and keeps holding up to date;
// s.mu is held.
func (s *sessionStore) setOwned(owner sessionOwner, list []*session) {
	pool := poolOf(owner)
	if was := len(s.owned[owner]); was > 0 {
		delete(s.holding[pool][was], owner)
	}
	if len(list) == 0 {
		delete(s.owned, owner)
		return
	}
	s.owned[owner] = list
	for len(s.holding[pool]) <= len(list) {
		s.holding[pool] = append(s.holding[pool], map[sessionOwner]struct{}{})
	}
	s.holding[pool][len(list)][owner] = struct{}{}
}

// poolOf is the index of owner's pool in sessionStore.pooled.
func poolOf(o sessionOwner) int {
	if o.operator {
		return 1
	}
	return 0
}

// dropExpired drops the sessions of list that have expired.
func (s *sessionStore) dropExpired(list []*session, now time.Time) {
	for _, old := range slices.Clone(list) {
		if !now.Before(old.expires) {
			s.drop(old)
		}
	}
}

// drop removes sess from the store; s.mu is held.
func (s *sessionStore) drop(sess *session) {
	if _, ok := s.sessions[sess.id]; !ok {
		return
	}
	delete(s.sessions, sess.id)
	s.setOwned(sess.owner, slices.DeleteFunc(s.owned[sess.owner], func(o *session) bool { return o == sess }))
	s.pooled[poolOf(sess.owner)]--
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
		s.drop(sess)
		return nil, false
	}
	return sess, true
}

// remove ends a session (sign-out).
func (s *sessionStore) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess, ok := s.sessions[id]; ok {
		s.drop(sess)
	}
}

// signInPace is a token bucket of one token's sign-ins: perMinute of
// them at once, then one every minute/perMinute.
type signInPace struct {
	tokens float64
	at     time.Time
}

// maxPaces bounds the buckets kept before the full ones (which say
// nothing a fresh bucket would not) are dropped. Buckets are per token of
// the tokens file, so they are few unless the file is.
const maxPaces = 1024

// pace takes one sign-in from owner's bucket, or says how long until one
// is there; s.mu is held.
func (s *sessionStore) pace(owner sessionOwner, now time.Time, perMinute int) time.Duration {
	perMinute = max(perMinute, 1)
	burst := float64(perMinute)
	refill := func(p *signInPace) {
		p.tokens = min(burst, p.tokens+now.Sub(p.at).Minutes()*burst)
		p.at = now
	}
	p, ok := s.paces[owner]
	if !ok {
		if len(s.paces) >= maxPaces {
			for o, q := range s.paces {
				if refill(q); q.tokens >= burst {
					delete(s.paces, o)
				}
			}
		}
		p = &signInPace{tokens: burst, at: now}
		s.paces[owner] = p
	}
	refill(p)
	if p.tokens < 1 {
		return time.Duration((1 - p.tokens) / burst * float64(time.Minute))
	}
	p.tokens--
	return 0
}

// sameToken compares two tokens in constant time.
func sameToken(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}
