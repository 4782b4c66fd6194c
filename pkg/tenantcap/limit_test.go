package tenantcap

import (
	"testing"

	"github.com/harvest-run/harvest/pkg/api"
	"pgregory.net/rapid"
)

// The tenant limit never grows with the total: Rule.LeaseNeeded's search
// rests on it (a larger lease bounds the other shards lower, so it can
// only raise the limit).
func TestLimitDoesNotGrowWithTotal(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		cfg := Config{
			Algorithm: rapid.SampledFrom([]api.Algorithm{api.AlgorithmNoLimit, api.AlgorithmStatic, api.AlgorithmDynamic}).Draw(t, "algorithm"),
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
