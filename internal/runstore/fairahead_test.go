package runstore

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func pass(v float64) *float64 { return &v }

func TestFairAhead(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		in    FairInput
		keys  int
		ahead int
		tag   float64
	}{
		{name: "alone and first", in: FairInput{Own: FairKey{Key: "a"}}, tag: 0},
		{name: "own backlog only", in: FairInput{Own: FairKey{Key: "a", Pending: 4}}, ahead: 4, tag: 4},
		{
			// Three keys at V=10: a is one claim in debt (pass 11), b and
			// c have none. The task is a's third in line (a_k = 2): S = 13.
			// b and c each start at 10 and have 3 claims before 13.
			name: "debt and two free keys",
			in: FairInput{Clock: 10, Own: FairKey{Key: "a", Pass: pass(11), Pending: 2}, Others: []FairKey{
				{Key: "b", Pass: pass(9), Pending: 5},
				{Key: "c", Pending: 2},
			}},
			keys: 2, ahead: 2 + 3 + 2, tag: 13,
		},
		{
			// A key whose tag is at or past S has nothing ahead (ties do
			// not count); one with higher-priority work still does.
			name: "keys behind and higher priority",
			in: FairInput{Clock: 0, HigherAhead: 3, Own: FairKey{Key: "a", Pending: 1}, Others: []FairKey{
				{Key: "b", Pass: pass(1), Pending: 9},
				{Key: "c", Pass: pass(5), Pending: 9, Higher: true},
			}},
			keys: 1, ahead: 3 + 1, tag: 1,
		},
		{
			// Weights: a heavy key gets w claims per unit of virtual time,
			// and a light own key pushes S out.
			name: "weights",
			in: FairInput{Clock: 0, Own: FairKey{Key: "a", Weight: 0.5, Pending: 1}, Others: []FairKey{
				{Key: "heavy", Weight: 4, Pending: 100},
				{Key: "light", Weight: 0.25, Pending: 100},
			}},
			keys: 2, ahead: 1 + 8 + 1, tag: 2,
		},
		{
			name: "capped is at least",
			in:   FairInput{Own: FairKey{Key: "a", Pending: 1}, Others: []FairKey{{Key: "b", Pending: 1}}, Capped: true},
			keys: 1, ahead: 2, tag: 1,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			got := FairAhead(c.in)
			require.Equal(t, c.keys, got.KeysAhead, "keys ahead")
			require.Equal(t, c.ahead, got.ClaimsAhead, "claims ahead")
			require.InDelta(t, c.tag, got.StartTag, 1e-9, "start tag")
			require.Equal(t, c.in.Capped, got.AtLeast)
		})
	}
}
