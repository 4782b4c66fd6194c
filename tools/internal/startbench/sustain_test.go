package startbench

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A step holds by the rule: at least 95% of the offered starts
// acknowledged, the 95th percentile of start-to-claim under 1 s, and
// nothing left unclaimed 10 s after the step.
func TestStepHoldsByTheRule(t *testing.T) {
	t.Parallel()
	ok := StepResult{Offered: 1000, Acked: 950, Claimed: 950, WaitP95: 999}
	for _, tc := range []struct {
		name  string
		edit  func(*StepResult)
		holds bool
	}{
		{"at the bounds", func(*StepResult) {}, true},
		{"too few acknowledged", func(r *StepResult) { r.Acked, r.Claimed = 949, 949 }, false},
		{"p95 at 1 s", func(r *StepResult) { r.WaitP95 = 1000 }, false},
		{"one left unclaimed", func(r *StepResult) { r.Unclaimed = 1 }, false},
		{"nothing claimed", func(r *StepResult) { r.Claimed = 0 }, false},
		{"nothing offered", func(r *StepResult) { r.Offered, r.Acked = 0, 0 }, false},
	} {
		r := ok
		tc.edit(&r)
		r.judge()
		require.Equal(t, tc.holds, r.Holds, tc.name)
	}
	r := ok
	r.judge()
	require.Equal(t, 95.0, r.AckedPct)
}
