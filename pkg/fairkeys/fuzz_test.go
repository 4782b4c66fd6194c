package fairkeys

import (
	"errors"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

var knownRules = map[string]bool{
	RuleEmpty: true, RuleBlank: true, RuleDot: true, RuleOuterWhitespace: true,
	RuleControlChar: true, RuleBidiControl: true, RuleInvalidUTF8: true, RuleTooLong: true,
	RuleOutOfRange: true, RuleNotFinite: true,
}

// checkRefusal requires err to be a well-formed *ValidationError.
func checkRefusal(t *testing.T, err error) {
	t.Helper()
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error %v (%T) is not a *ValidationError", err, err)
	}
	if !knownRules[ve.Rule] || ve.Message == "" {
		t.Fatalf("malformed ValidationError %+v", ve)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("error %v does not match ErrInvalid", err)
	}
}

func FuzzValidateKey(f *testing.F) {
	for _, s := range []string{"tenant-42", "", ".", "..", "...", " a", "a ", "a\tb", "a\x00", "\xff", "é", "\u2028x", "a\u202eb", "\u2066x", strings.Repeat("k", MaxKeyBytes+1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, k string) {
		err := ValidateKey(k)
		if err != nil {
			checkRefusal(t, err)
			if Resolve("", k) != DefaultKey {
				t.Fatalf("Resolve used the invalid quota key %q", k)
			}
			return
		}
		// Accepted: every rule must hold, checked independently here.
		if k == "" || k == "." || k == ".." || len(k) > MaxKeyBytes || !utf8.ValidString(k) {
			t.Fatalf("accepted key %q breaks a structural rule", k)
		}
		runes := []rune(k)
		if unicode.IsSpace(runes[0]) || unicode.IsSpace(runes[len(runes)-1]) {
			t.Fatalf("accepted key %q has outer whitespace", k)
		}
		for _, r := range runes {
			if unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
				t.Fatalf("accepted key %q holds control character %U", k, r)
			}
		}
		if Resolve("", k) != k {
			t.Fatalf("Resolve dropped the valid quota key %q", k)
		}
	})
}

func FuzzValidateQueueName(f *testing.F) {
	for _, s := range []string{"shared", "orders.eu", "", " ", "\t\n", ".", "..", " q", "q\u3000", "q\u202e", "\u200fq", strings.Repeat("q", MaxQueueBytes+1), "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		err := ValidateQueueName(q)
		if err != nil {
			checkRefusal(t, err)
			return
		}
		if strings.TrimSpace(q) == "" || q == "." || q == ".." || len(q) > MaxQueueBytes {
			t.Fatalf("accepted queue name %q breaks a rule", q)
		}
		first, _ := utf8.DecodeRuneInString(q)
		last, _ := utf8.DecodeLastRuneInString(q)
		if unicode.IsSpace(first) || unicode.IsSpace(last) {
			t.Fatalf("accepted queue name %q has outer whitespace", q)
		}
	})
}
