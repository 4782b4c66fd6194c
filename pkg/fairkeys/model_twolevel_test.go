package fairkeys

// Property tests of two-level fairness (SetTwoLevel) on the Model: groups
// share a queue by their weights whatever their number of keys, and the
// keys of one group share its claims by theirs.

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// groupLog is stepLog for groups: backlogged groups before each claim and
// cumulative claims per group after it, in the shape checkPairBound reads.
func groupLog(l *stepLog) *stepLog {
	out := &stepLog{}
	for _, b := range l.backlogged {
		g := map[string]bool{}
		for k, on := range b {
			g[GroupOf(k)] = g[GroupOf(k)] || on
		}
		out.backlogged = append(out.backlogged, g)
	}
	for _, c := range l.cum {
		g := map[string]int{}
		for k, n := range c {
			g[GroupOf(k)] += n
		}
		out.cum = append(out.cum, g)
	}
	return out
}

// Tenants with 1 to 40 keys each, random weights for tenants and keys,
// backlogs and arrivals: over every window in which two tenants both have
// work, their claims divided by their weights differ by at most
// 1/wa + 1/wb, however many keys each has; and two keys of one tenant,
// both with work, stay within the same bound of their own weights.
func TestPropertyTwoLevelBounds(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		s := newSim()
		s.m.SetTwoLevel(propQueue, true)
		tenants := keyNames("t", rapid.IntRange(2, 4).Draw(rt, "tenants"))
		var keys []string
		byTenant := map[string][]string{}
		tw := map[string]float64{}
		for _, tn := range tenants {
			n := rapid.SampledFrom([]int{1, 1, 2, 5, 40}).Draw(rt, "keys")
			for i := range n {
				k := tn
				if i > 0 {
					k = fmt.Sprintf("%s/k%d", tn, i)
				}
				keys = append(keys, k)
				byTenant[tn] = append(byTenant[tn], k)
			}
			tw[tn] = weightGen.Draw(rt, "tenant weight")
			s.m.SetGroupWeight(propQueue, tn, tw[tn])
		}
		w := drawWeights(rt, s.m, keys)
		steps := rapid.IntRange(50, 400).Draw(rt, "steps")
		for _, k := range keys {
			s.add(k, rapid.IntRange(0, 40).Draw(rt, "backlog"))
		}
		var l stepLog
		for range steps {
			if rapid.IntRange(0, 3).Draw(rt, "arrive") == 0 {
				s.add(rapid.SampledFrom(keys).Draw(rt, "key"), rapid.IntRange(1, 10).Draw(rt, "n"))
			}
			l.record(s)
		}
		g := groupLog(&l)
		for x, a := range tenants {
			for _, b := range tenants[x+1:] {
				checkPairBound(rt, g, a, b, tw[a], tw[b])
			}
		}
		for _, tn := range tenants {
			ks := byTenant[tn]
			for x, i := range ks[:min(len(ks), 6)] {
				for _, j := range ks[x+1 : min(len(ks), 6)] {
					checkPairBound(rt, &l, i, j, w[i], w[j])
				}
			}
		}
	})
}

// The case the second level is for: a tenant with 100 keys against one
// with a single key, equal weights, both backlogged: their claims stay
// within one of each other at every step, where one level would give the
// first tenant about 100 claims of every 101.
func TestTwoLevelManyKeysDoNotGainShares(t *testing.T) {
	t.Parallel()
	for _, twoLevel := range []bool{false, true} {
		s := newSim()
		s.m.SetTwoLevel(propQueue, twoLevel)
		for i := range 100 {
			s.add(fmt.Sprintf("acme/k%d", i), 10)
		}
		s.add("globex", 1000)
		claims := map[string]int{}
		for range 400 {
			r := s.claim()
			require.True(t, r.OK)
			claims[GroupOf(r.Task.Key)]++
			if twoLevel {
				d := claims["acme"] - claims["globex"]
				require.LessOrEqual(t, d*d, 1, "claims %v", claims)
			}
		}
		if !twoLevel {
			require.Greater(t, claims["acme"], 350, "one level: a share per key (%v)", claims)
		}
	}
}

// Turning two-level off gives back the one-level order: the model with it
// never turned on and one where it was turned on and off again before any
// claim pick the same tasks.
func TestTwoLevelOffIsOneLevel(t *testing.T) {
	t.Parallel()
	a, b := newSim(), newSim()
	b.m.SetTwoLevel(propQueue, true)
	b.m.SetTwoLevel(propQueue, false)
	for _, s := range []*sim{a, b} {
		s.add("acme/x", 5)
		s.add("acme/y", 5)
		s.add("globex", 5)
	}
	for range 15 {
		ra, rb := a.claim(), b.claim()
		require.Equal(t, ra.Task.ID, rb.Task.ID)
	}
}

func TestGroupOf(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]string{"": "", "acme": "acme", "acme/k1": "acme", "acme/a/b": "acme"} {
		require.Equal(t, want, GroupOf(key), key)
	}
}
