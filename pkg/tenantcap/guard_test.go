package tenantcap

import (
	"testing"

	"pgregory.net/rapid"
)

// The tenant limit never grows with the total: the guard's promise rests
// on it.
func TestLimitDoesNotGrowWithTotal(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		cfg := Config{
			Algorithm: rapid.SampledFrom([]Algorithm{NoLimit, Static, Dynamic}).Draw(t, "algorithm"),
			TFM:       rapid.Float64Range(0.001, 50).Draw(t, "tfm"),
		}
		maxRuns := rapid.IntRange(1, 100_000).Draw(t, "max")
		tenants := rapid.IntRange(0, 1000).Draw(t, "tenants")
		lo := rapid.IntRange(0, 2*maxRuns).Draw(t, "lo")
		hi := rapid.IntRange(lo, 2*maxRuns+1).Draw(t, "hi")
		l1, _ := Limit(cfg, maxRuns, tenants, lo)
		l2, _ := Limit(cfg, maxRuns, tenants, hi)
		if l2 > l1 {
			t.Fatalf("limit at total %d is %d, above %d at total %d", hi, l2, l1, lo)
		}
	})
}

// Whatever the group does within its guard, Decide would have admitted
// each of its starts, one after the other, with the counts it had.
func TestGuardOnlyAdmitsWhatDecideAdmits(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		cfg := Config{
			Algorithm: rapid.SampledFrom([]Algorithm{NoLimit, Static, Dynamic}).Draw(t, "algorithm"),
			TFM:       float64(rapid.IntRange(1, 40).Draw(t, "tfm_quarters")) / 4,
		}
		maxRuns := rapid.IntRange(1, 2000).Draw(t, "max")
		tenants := rapid.IntRange(0, 20).Draw(t, "tenants")
		others := rapid.IntRange(0, maxRuns+10).Draw(t, "others")
		// The estimate the guard gets may be off either way.
		local := rapid.IntRange(0, maxRuns+10).Draw(t, "local_estimate")
		starts := rapid.IntRange(1, 48).Draw(t, "starts")
		g, ok := guard(cfg, maxRuns, tenants, others, local, []string{"a", "b"}, starts)
		if !ok {
			return
		}
		// The actual state: each tenant's count and the shard's before the
		// group, drawn close to the guard's bounds where the limits bite,
		// then the group's starts in order.
		seq := rapid.SliceOfN(rapid.SampledFrom([]string{"a", "b"}), 1, starts).Draw(t, "group")
		own := map[string]int{}
		for _, tn := range []string{"a", "b"} {
			n := 0
			for _, x := range seq {
				if x == tn {
					n++
				}
			}
			hi := g.Shard
			if limit, bounded := g.Tenant[tn]; bounded {
				hi = limit - n // the most it may hold for the group to pass
			}
			if hi < 0 {
				return
			}
			own[tn] = rapid.IntRange(max(0, hi-3), hi).Draw(t, tn+"_before")
		}
		lo := own["a"] + own["b"]
		hi := g.Shard - len(seq)
		if hi < lo {
			return
		}
		shard := rapid.IntRange(max(lo, hi-3), hi).Draw(t, "shard_before")
		for i, tn := range seq {
			d := Decide(cfg, maxRuns, tenants, shard+i+others, own[tn])
			if !d.Admit {
				t.Fatalf("start %d (tenant %s, own %d, total %d) passed guard %+v but Decide refuses it: %s",
					i, tn, own[tn], shard+i+others, g, d.Message())
			}
			own[tn]++
		}
	})
}
