package fairkeys

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestValidateKey(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, key, rule string
	}{
		{"plain", "tenant-42", ""},
		{"unicode", "Zürich/東京", ""},
		{"inner space", "a b", ""},
		{"dots inside", "a..b", ""},
		{"triple dot", "...", ""},
		{"max length", strings.Repeat("k", MaxKeyBytes), ""},
		{"empty", "", RuleEmpty},
		{"dot", ".", RuleDot},
		{"dot dot", "..", RuleDot},
		{"leading space", " a", RuleOuterWhitespace},
		{"trailing newline", "a\n", RuleOuterWhitespace},
		{"only space", " ", RuleOuterWhitespace},
		{"trailing nbsp", "a\u00a0", RuleOuterWhitespace},
		{"inner control", "a\x00b", RuleControlChar},
		{"inner tab", "a\tb", RuleControlChar},
		{"inner DEL", "a\x7fb", RuleControlChar},
		{"C1 control", "a\u0085b", RuleControlChar},
		{"bad utf8", "a\xffb", RuleInvalidUTF8},
		{"too long", strings.Repeat("k", MaxKeyBytes+1), RuleTooLong},
		{"too long multibyte", strings.Repeat("é", 129), RuleTooLong},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := ValidateKey(tc.key)
			if tc.rule == "" {
				require.NoError(t, err)
				return
			}
			requireRule(t, err, tc.rule)
		})
	}
}

func TestValidateQueueName(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, queue, rule string
	}{
		{"plain", "shared", ""},
		{"dotted", "orders.eu", ""},
		{"max length", strings.Repeat("q", MaxQueueBytes), ""},
		{"empty", "", RuleBlank},
		{"blank", " \t\n", RuleBlank},
		{"leading space", " q", RuleOuterWhitespace},
		{"trailing space", "q ", RuleOuterWhitespace},
		{"dot", ".", RuleDot},
		{"dot dot", "..", RuleDot},
		{"too long", strings.Repeat("q", MaxQueueBytes+1), RuleTooLong},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := ValidateQueueName(tc.queue)
			if tc.rule == "" {
				require.NoError(t, err)
				return
			}
			requireRule(t, err, tc.rule)
		})
	}
}

func TestValidateWeight(t *testing.T) {
	t.Parallel()
	for _, w := range []float64{MinWeight, 1, 2.5, MaxWeight} {
		require.NoError(t, ValidateWeight(w), "%v", w)
	}
	for _, w := range []float64{0, -1, 0.000999, 1000.0001, math.MaxFloat64} {
		requireRule(t, ValidateWeight(w), RuleOutOfRange)
	}
	for _, w := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		requireRule(t, ValidateWeight(w), RuleNotFinite)
	}
}

func TestValidationErrorMessageSuitsAFieldPrefix(t *testing.T) {
	t.Parallel()
	err := ValidateKey(" x")
	require.Equal(t, "must not start or end with whitespace", err.Error())
	require.ErrorIs(t, err, ErrInvalid)
	require.False(t, errors.Is(errors.New("other"), ErrInvalid))
}

func TestResolve(t *testing.T) {
	t.Parallel()
	require.Equal(t, "fk", Resolve("fk", "qk"))
	require.Equal(t, "qk", Resolve("", "qk"))
	require.Equal(t, DefaultKey, Resolve("", ""))
	require.Equal(t, DefaultKey, Resolve("", " qk"), "a quota key that is not a valid fairness key is not used")
	require.Equal(t, DefaultKey, Resolve("", ".."))
	require.Equal(t, DefaultKey, Resolve("", strings.Repeat("q", MaxKeyBytes+1)))
}

func TestEffectiveWeight(t *testing.T) {
	t.Parallel()
	require.Equal(t, 1.0, EffectiveWeight(DefaultKey, 5, true))
	require.Equal(t, 1.0, EffectiveWeight("k", 0, false))
	require.Equal(t, 5.0, EffectiveWeight("k", 5, true))
}

func requireRule(t testing.TB, err error, rule string) {
	t.Helper()
	require.Error(t, err)
	var ve *ValidationError
	require.ErrorAs(t, err, &ve)
	require.Equal(t, rule, ve.Rule)
	require.NotEmpty(t, ve.Message)
	require.ErrorIs(t, err, ErrInvalid)
}
