package tenantcap

import (
	"errors"
	"math"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"

	"github.com/harvest-run/harvest/pkg/api"
)

func TestDefaults(t *testing.T) {
	t.Parallel()
	require.Equal(t, Config{Algorithm: api.AlgorithmNoLimit, TFM: 1}, DefaultConfig())
	require.NoError(t, DefaultConfig().Validate())
	s := DefaultSettings()
	require.Equal(t, 128, s.MaxRuns)
	require.NoError(t, s.Validate())
	s.MaxRuns = 0
	require.ErrorContains(t, s.Validate(), "HARVEST_MAX_RUNS")
}

func TestValidateNamesTheField(t *testing.T) {
	t.Parallel()
	for _, tfm := range []float64{0, -1, math.NaN(), math.Inf(1), math.Inf(-1), 1e-320, 1e-10} {
		err := Config{Algorithm: api.AlgorithmStatic, TFM: tfm}.Validate()
		var ae *api.Error
		require.True(t, errors.As(err, &ae), "tfm %v", tfm)
		require.Equal(t, "tfm", ae.Field)
		require.Equal(t, http.StatusBadRequest, ae.Status)
	}
	// A multiplier whose limit rounds to nothing for a lone tenant with
	// the whole system free is refused once the system limit is known.
	require.NoError(t, ValidateTFMFor(1.0/128, 128))
	require.NoError(t, ValidateTFMFor(0.001, 0))
	for _, tfm := range []float64{0.001, 1e-320} {
		err := ValidateTFMFor(tfm, 128)
		var ae *api.Error
		require.True(t, errors.As(err, &ae), "tfm %v", tfm)
		require.Equal(t, "tfm", ae.Field)
		require.Contains(t, ae.Message, "limit")
	}
	err := Config{Algorithm: "fair", TFM: 1}.Validate()
	var ae *api.Error
	require.True(t, errors.As(err, &ae))
	require.Equal(t, "algorithm", ae.Field)
	_, perr := ParseAlgorithm("Static")
	require.Error(t, perr)
	for _, a := range Algorithms() {
		got, err := ParseAlgorithm(string(a))
		require.NoError(t, err)
		require.Equal(t, a, got)
	}
}

// The worked examples of the specification.
func TestSpecExamples(t *testing.T) {
	t.Parallel()
	const maxRuns, tenants = 128, 8

	static := Config{Algorithm: api.AlgorithmStatic, TFM: 1}
	limit, limited := Limit(static, maxRuns, tenants, 0)
	require.True(t, limited)
	require.Equal(t, 16, limit, "128 runs, 8 tenants, TFM 1: 16 each")
	require.True(t, Decide(static, maxRuns, tenants, 40, 15).Admit)
	d := Decide(static, maxRuns, tenants, 40, 16)
	require.False(t, d.Admit)
	require.Equal(t, ReasonTenant, d.Reason)

	dyn := Config{Algorithm: api.AlgorithmDynamic, TFM: 3}
	// The specification prints 384 for this case, but its own formula
	// gives 3 × 96 = 288 (384 would be 4 × 96, or 3 × 128). The formula is
	// the contract, and the example's point stands either way: with the
	// limit far above both tenants' counts, both get in.
	limit, _ = Limit(dyn, maxRuns, tenants, 32)
	require.Equal(t, 288, limit, "32 in flight: spare 96, limit 3 × 96")
	limit, _ = Limit(Config{Algorithm: api.AlgorithmDynamic, TFM: 4}, maxRuns, tenants, 32)
	require.Equal(t, 384, limit, "the figure printed in the specification is TFM 4 × 96")
	require.True(t, Decide(dyn, maxRuns, tenants, 32, 1).Admit)
	require.True(t, Decide(dyn, maxRuns, tenants, 32, 29).Admit)

	limit, _ = Limit(dyn, maxRuns, tenants, 120)
	require.Equal(t, 24, limit, "120 in flight: spare 8, limit 24")
	require.True(t, Decide(dyn, maxRuns, tenants, 120, 1).Admit)
	d = Decide(dyn, maxRuns, tenants, 120, 29)
	require.False(t, d.Admit)
	e := d.Err()
	require.Equal(t, http.StatusTooManyRequests, e.Status)
	require.Equal(t, api.CodeOverLimit, e.Code)
	require.Positive(t, e.RetryAfterMS)
	require.Contains(t, e.Message, "dynamic")
	require.Contains(t, e.Message, "limit is 24")
	require.Contains(t, e.Message, "holds 29")
}

func TestNoLimitOnlySystemLimit(t *testing.T) {
	t.Parallel()
	cfg := Config{Algorithm: api.AlgorithmNoLimit, TFM: 0.001}
	_, limited := Limit(cfg, 128, 8, 0)
	require.False(t, limited)
	require.True(t, Decide(cfg, 128, 8, 127, 127).Admit, "one tenant may use all of max_runs")
	d := Decide(cfg, 128, 8, 128, 3)
	require.False(t, d.Admit)
	require.Equal(t, ReasonSystem, d.Reason)
	require.Contains(t, d.Err().Message, "max_runs=128")
	require.Contains(t, d.Err().Message, "no_limit")
	require.Contains(t, d.Err().Message, "holds 3")
}

func TestSystemLimitHoldsUnderEveryAlgorithm(t *testing.T) {
	t.Parallel()
	for _, a := range Algorithms() {
		d := Decide(Config{Algorithm: a, TFM: 1000}, 10, 1, 10, 0)
		require.False(t, d.Admit, "%s", a)
		require.Equal(t, ReasonSystem, d.Reason)
	}
}

func TestStaticWithoutTenantsCountsOne(t *testing.T) {
	t.Parallel()
	limit, _ := Limit(Config{Algorithm: api.AlgorithmStatic, TFM: 0.5}, 128, 0, 0)
	require.Equal(t, 64, limit)
	limit, _ = Limit(Config{Algorithm: api.AlgorithmStatic, TFM: 0.3}, 10, 1, 0)
	require.Equal(t, 3, limit, "0.3 × 10 is 3 despite binary rounding")
}

func TestDynamicRoundingAndBounds(t *testing.T) {
	t.Parallel()
	dyn := func(tfm float64, maxRuns, total int) int {
		l, _ := Limit(Config{Algorithm: api.AlgorithmDynamic, TFM: tfm}, maxRuns, 1, total)
		return l
	}
	require.Equal(t, 3, dyn(0.1, 40, 10), "0.1 × 30 is 3 despite binary rounding")
	require.Equal(t, 11, dyn(1.5, 10, 3), "fewer than 10.5 means at most 10")
	require.Equal(t, 1, dyn(0.001, 10, 9), "a tenant with nothing may start while capacity is left")
	require.Equal(t, 0, dyn(3, 10, 10))
	require.Equal(t, 0, dyn(3, 10, 15), "over max after an overshoot")
	require.Equal(t, maxLimit, dyn(1e300, 10, 0))
}

// For multipliers that are exact in binary the integer limit is exactly the
// rule of the specification.
func TestDecideMatchesTheRule(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		quarters := rapid.IntRange(1, 40).Draw(t, "tfm_quarters")
		tfm := float64(quarters) / 4
		maxRuns := rapid.IntRange(1, 500).Draw(t, "max")
		tenants := rapid.IntRange(0, 50).Draw(t, "tenants")
		total := rapid.IntRange(0, 2*maxRuns).Draw(t, "total")
		own := rapid.IntRange(0, total).Draw(t, "own")

		dyn := Decide(Config{Algorithm: api.AlgorithmDynamic, TFM: tfm}, maxRuns, tenants, total, own)
		spare := max(maxRuns-total, 0)
		want := total < maxRuns && 4*own < quarters*spare
		if dyn.Admit != want {
			t.Fatalf("dynamic tfm %v max %d total %d own %d: admit %v, want %v", tfm, maxRuns, total, own, dyn.Admit, want)
		}

		st := Decide(Config{Algorithm: api.AlgorithmStatic, TFM: tfm}, maxRuns, tenants, total, own)
		share := quarters * maxRuns / (4 * max(tenants, 1))
		want = total < maxRuns && own < share
		if st.Admit != want {
			t.Fatalf("static tfm %v max %d tenants %d own %d: admit %v, want %v (share %d)", tfm, maxRuns, tenants, own, st.Admit, want, share)
		}
		if !dyn.Admit && dyn.RetryAfter <= 0 {
			t.Fatalf("refusal without a retry hint")
		}
	})
}

func TestParsePut(t *testing.T) {
	t.Parallel()
	p, err := ParsePut([]byte(`{"algorithm":"dynamic","tfm":3}`))
	require.NoError(t, err)
	require.Equal(t, Config{Algorithm: api.AlgorithmDynamic, TFM: 3}, p.Apply(DefaultConfig()))

	p, err = ParsePut([]byte(`{"tfm":2.5}`))
	require.NoError(t, err)
	require.Nil(t, p.Algorithm)
	require.Equal(t, Config{Algorithm: api.AlgorithmNoLimit, TFM: 2.5}, p.Apply(DefaultConfig()))

	cases := []struct{ body, field, msg string }{
		{`{"max_runs":256}`, "max_runs", "read-only"},
		{`{"algorithm":"static","max_runs":128,"tfm":1}`, "max_runs", "read-only"},
		{`{"algorithm":"static","colour":"red"}`, "colour", "unknown field"},
		{`{"algorithm":"fair"}`, "algorithm", "unknown algorithm"},
		{`{"algorithm":3}`, "algorithm", "string"},
		{`{"tfm":0}`, "tfm", "positive finite"},
		{`{"tfm":-2}`, "tfm", "positive finite"},
		{`{"tfm":1e999}`, "tfm", "positive finite"},
		{`{"tfm":"3"}`, "tfm", "positive finite"},
		{`{"tfm":null}`, "tfm", "positive finite"},
		{`{}`, "", "nothing to change"},
		{`[]`, "", "JSON object"},
		{`null`, "", "JSON object"},
		{`{"tfm":1} {"tfm":2}`, "", "one JSON object"},
		{`not json`, "", "JSON object"},
	}
	for _, c := range cases {
		_, err := ParsePut([]byte(c.body))
		var ae *api.Error
		require.True(t, errors.As(err, &ae), c.body)
		require.Equal(t, http.StatusBadRequest, ae.Status, c.body)
		require.Equal(t, c.field, ae.Field, c.body)
		require.Contains(t, ae.Message, c.msg, c.body)
	}
}
