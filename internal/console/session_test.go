package console

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeClock is a settable clock for the sessions' expiry and pace.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// testLimits are the default per-token bounds.
var testLimits = sessionLimits{perPrincipal: 5, signInsPerMinute: 10}

func tenantOwner(name string) sessionOwner { return sessionOwner{principal: name} }

// A tenant signing in 20,000 times, alone or spread over 4,000 tokens of
// its own, never ends an operator's session: a token keeps at most its own
// few sessions, and the tenants' sessions live in a pool of their own.
func TestSessionsTenantsCannotEvictOperators(t *testing.T) {
	t.Parallel()
	for _, principals := range []int{1, 4000} {
		t.Run(fmt.Sprintf("%d tokens", principals), func(t *testing.T) {
			t.Parallel()
			clock := &fakeClock{now: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)}
			s := newSessionStore(30*time.Minute, clock.Now)
			op, _, err := s.create("op-secret", sessionOwner{operator: true, principal: "ops"}, testLimits)
			require.NoError(t, err)
			// A pace that lets every sign-in of the spread case through,
			// so that the tenants fill their pool and more.
			lim := sessionLimits{perPrincipal: 5, signInsPerMinute: 600}
			made := 0
			for i := range 20000 {
				clock.Add(time.Millisecond)
				if _, _, err := s.create("t-secret", tenantOwner(fmt.Sprintf("tenant-%d", i%principals)), lim); err == nil {
					made++
				}
				_, ok := s.get(op.id)
				require.True(t, ok, "the operator's session ended at the tenants' sign-in %d", i)
			}
			require.Positive(t, made)
			require.Equal(t, min(principals*lim.perPrincipal, poolSessions), s.pooled[0], "the tenants' pool filled up")
			require.Equal(t, 1, s.pooled[1])
			for o, list := range s.owned {
				require.LessOrEqual(t, len(list), lim.perPrincipal, o.principal)
			}
			checkSessionIndex(t, s)
		})
	}
}

// checkSessionIndex checks that the store's counts and indexes agree with
// its sessions.
func checkSessionIndex(t *testing.T, s *sessionStore) {
	t.Helper()
	// Plain checks: require's reflection is slow over 10,000 sessions.
	if len(s.sessions) != s.pooled[0]+s.pooled[1] {
		t.Fatalf("%d sessions, pools count %v", len(s.sessions), s.pooled)
	}
	for pool, index := range s.holding {
		total := 0
		for n, owners := range index {
			for o := range owners {
				if len(s.owned[o]) != n || poolOf(o) != pool {
					t.Fatalf("%v indexed as holding %d in pool %d, holds %d", o, n, pool, len(s.owned[o]))
				}
				total += n
			}
		}
		if total != s.pooled[pool] {
			t.Fatalf("pool %d: index counts %d sessions, pool %d", pool, total, s.pooled[pool])
		}
	}
	for o, list := range s.owned {
		if _, ok := s.holding[poolOf(o)][len(list)][o]; !ok {
			t.Fatalf("%v holding %d is not indexed", o, len(list))
		}
		for _, sess := range list {
			if s.sessions[sess.id] != sess {
				t.Fatalf("%v lists a session the store does not hold", o)
			}
		}
	}
}

// A token past its cap loses its own oldest session, and only that one.
func TestSessionsPerTokenCapEndsOwnOldest(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: time.Now()}
	s := newSessionStore(30*time.Minute, clock.Now)
	other, _, err := s.create("b", tenantOwner("b-ci"), testLimits)
	require.NoError(t, err)
	var mine []*session
	for range testLimits.perPrincipal + 1 {
		clock.Add(time.Second)
		sess, _, err := s.create("a", tenantOwner("a-ci"), testLimits)
		require.NoError(t, err)
		mine = append(mine, sess)
	}
	_, ok := s.get(mine[0].id)
	require.False(t, ok, "the oldest session of the token past its cap ended")
	for _, sess := range mine[1:] {
		_, ok := s.get(sess.id)
		require.True(t, ok)
	}
	_, ok = s.get(other.id)
	require.True(t, ok, "another token's session stays")
	checkSessionIndex(t, s)
}

// A full pool makes room only at the expense of the token holding the
// most sessions, while it holds two more than the newcomer would; past
// that a sign-in is refused, and the operators' pool is untouched.
func TestSessionsFullPoolSharesFairly(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: time.Now()}
	s := newSessionStore(30*time.Minute, clock.Now)
	s.poolCap = 4
	sign := func(name string, operator bool) (*session, error) {
		clock.Add(time.Second)
		sess, _, err := s.create("x", sessionOwner{operator: operator, principal: name}, testLimits)
		return sess, err
	}
	var a []*session
	for range 3 {
		sess, err := sign("a", false)
		require.NoError(t, err)
		a = append(a, sess)
	}
	b, err := sign("b", false)
	require.NoError(t, err)
	count := func(name string) int { return len(s.owned[tenantOwner(name)]) }

	_, err = sign("c", false)
	require.NoError(t, err)
	require.Equal(t, 2, count("a"), "c took a's oldest: a held 3")
	_, ok := s.get(a[0].id)
	require.False(t, ok)
	_, err = sign("d", false)
	require.NoError(t, err)
	require.Equal(t, []int{1, 1, 1, 1}, []int{count("a"), count("b"), count("c"), count("d")})
	_, retry, err := s.create("x", tenantOwner("e"), testLimits)
	require.ErrorIs(t, err, errSessionsFull, "every token holds one: no room without taking a share")
	require.Positive(t, retry)
	_, err = sign("b", false)
	require.ErrorIs(t, err, errSessionsFull, "b may not take a second session from a token holding one")
	_, ok = s.get(b.id)
	require.True(t, ok)

	for range 4 {
		_, err := sign(fmt.Sprint("op", s.pooled[1]), true)
		require.NoError(t, err, "the operators' pool has its own room")
	}
	require.Equal(t, 4, s.pooled[0])

	// Once sessions expire, their room is free again.
	clock.Add(31 * time.Minute)
	_, err = sign("e", false)
	require.NoError(t, err)
	require.Equal(t, 1, s.pooled[0])
	checkSessionIndex(t, s)
}
