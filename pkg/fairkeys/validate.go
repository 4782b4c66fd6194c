package fairkeys

import (
	"errors"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits shared by the start path, the weight API and the claim.
const (
	// DefaultKey is the key of every task whose run named neither a usable
	// fairness key nor a usable quota key. Callers can never set it because
	// ValidateKey refuses the empty string, and its weight is pinned to 1.
	DefaultKey = ""

	// MaxKeyBytes caps a fairness key; it matches the quota-key cap so that
	// every valid quota key can double as a fairness key.
	MaxKeyBytes = 256

	// MaxQueueBytes caps a queue name accepted by fair workers and the
	// weight API.
	MaxQueueBytes = 255

	// MinWeight is the smallest weight override. A floor keeps 1/w finite
	// and a single claim from pushing a key's pass absurdly far ahead.
	MinWeight = 0.001

	// MaxWeight is the largest weight override.
	MaxWeight = 1000.0

	// MaxOverridesPerQueue bounds the override rows a queue may hold, so the
	// weight lookup of a fair claim stays cheap. The model does not enforce
	// it; the weight store does.
	MaxOverridesPerQueue = 1000
)

// Stable rule identifiers carried by ValidationError.Rule. API layers may
// expose them to clients, so they must never change meaning.
const (
	RuleEmpty           = "empty"
	RuleBlank           = "blank"
	RuleDot             = "dot"
	RuleOuterWhitespace = "outer_whitespace"
	RuleControlChar     = "control_char"
	RuleBidiControl     = "bidi_control"
	RuleInvalidUTF8     = "invalid_utf8"
	RuleTooLong         = "too_long"
	RuleOutOfRange      = "out_of_range"
	RuleNotFinite       = "not_finite"
)

// ErrInvalid is matched by every error this package's validators return, so
// callers can map all of them to one status (HTTP 400) with errors.Is.
var ErrInvalid = errors.New("fairkeys: invalid value")

// ValidationError reports which rule a value broke. Message is phrased
// without a subject ("must not be empty") so that an HTTP layer can prefix
// the field name it validated.
type ValidationError struct {
	// Rule is one of the Rule* identifiers.
	Rule string
	// Message is a human sentence fragment naming the broken rule.
	Message string
}

// Error returns the message alone; the caller knows which field it checked.
func (e *ValidationError) Error() string { return e.Message }

// Is makes errors.Is(err, ErrInvalid) hold for every ValidationError.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

func invalid(rule, msg string) error { return &ValidationError{Rule: rule, Message: msg} }

// ValidateKey checks a caller-supplied fairness key. It returns nil or a
// *ValidationError. Checks run in a fixed order so a value that breaks
// several rules always reports the same one: empty, length, UTF-8, dot
// names, outer whitespace, control characters.
func ValidateKey(k string) error {
	if k == "" {
		return invalid(RuleEmpty, "must not be empty")
	}
	if len(k) > MaxKeyBytes {
		return invalid(RuleTooLong, "must be at most "+strconv.Itoa(MaxKeyBytes)+" bytes")
	}
	if !utf8.ValidString(k) {
		return invalid(RuleInvalidUTF8, "must be valid UTF-8")
	}
	if k == "." || k == ".." {
		return invalid(RuleDot, `must not be "." or ".."`)
	}
	if hasOuterSpace(k) {
		return invalid(RuleOuterWhitespace, "must not start or end with whitespace")
	}
	if err := noControls(k); err != nil {
		return err
	}
	return nil
}

// ValidateQuotaKey checks a caller-supplied quota key. Its rules are looser
// than a fairness key's: a quota key names a cap and a rate, not a share of
// the claims, so outer whitespace, dot names and control characters are
// allowed. It must not be empty (a start without a quota key leaves the
// field out), is at most MaxKeyBytes long, and must be text the database
// can store: valid UTF-8 without NUL. A quota key that is not also a valid
// fairness key is never used as one (see Resolve).
func ValidateQuotaKey(k string) error {
	if k == "" {
		return invalid(RuleEmpty, "must not be empty (leave it out for no quota key)")
	}
	if len(k) > MaxKeyBytes {
		return invalid(RuleTooLong, "must be at most "+strconv.Itoa(MaxKeyBytes)+" bytes")
	}
	if !utf8.ValidString(k) {
		return invalid(RuleInvalidUTF8, "must be valid UTF-8")
	}
	return noControls(k)
}

// ValidateQueueName checks a queue name the way the weight API does. A fair
// worker applies it at start: a queue whose name the weight API would refuse
// could never receive an override, so serving it fairly would be a trap.
// Only the rules below apply.
func ValidateQueueName(q string) error {
	if strings.TrimSpace(q) == "" {
		return invalid(RuleBlank, "must not be blank")
	}
	if len(q) > MaxQueueBytes {
		return invalid(RuleTooLong, "must be at most "+strconv.Itoa(MaxQueueBytes)+" bytes")
	}
	if hasOuterSpace(q) {
		return invalid(RuleOuterWhitespace, "must not start or end with whitespace")
	}
	if q == "." || q == ".." {
		return invalid(RuleDot, `must not be "." or ".."`)
	}
	// The database stores names as UTF-8 text, which can hold neither
	// invalid sequences nor NUL: such a name could never be written.
	if !utf8.ValidString(q) {
		return invalid(RuleInvalidUTF8, "must be valid UTF-8")
	}
	// Queue names are drawn by the admin page and printed by the CLI: a
	// control or bidirectional-override character could disguise one
	// queue as another there.
	if err := noControls(q); err != nil {
		return err
	}
	return nil
}

// ValidateWeight checks a weight override. NaN and infinities are refused
// before the range check because comparisons with NaN are always false.
func ValidateWeight(w float64) error {
	if math.IsNaN(w) || math.IsInf(w, 0) {
		return invalid(RuleNotFinite, "must be a finite number")
	}
	if w < MinWeight || w > MaxWeight {
		return invalid(RuleOutOfRange, "must be between 0.001 and 1000")
	}
	return nil
}

// ValidateChars refuses the characters no name may hold, whatever its
// other rules: control characters and the bidirectional controls (see
// noControls). Run ids and names (pkg/api) are checked with it, so every
// name Harvest shows is held to this one list.
func ValidateChars(s string) error { return noControls(s) }

// noControls refuses control characters and the invisible characters that
// reorder text (bidirectional embeddings, overrides, isolates and marks),
// with which a name could be made to look like another where it is shown.
func noControls(s string) error {
	for _, r := range s {
		if unicode.IsControl(r) {
			return invalid(RuleControlChar, "must not contain control characters")
		}
		if isBidiControl(r) {
			return invalid(RuleBidiControl, "must not contain bidirectional control characters (U+061C, U+200E, U+200F, U+202A to U+202E, U+2066 to U+2069)")
		}
	}
	return nil
}

// isBidiControl reports the characters of Unicode's Bidi_Control property.
func isBidiControl(r rune) bool {
	return unicode.Is(unicode.Bidi_Control, r)
}

// hasOuterSpace reports whether the first or last rune is whitespace. Bytes
// that do not decode count as RuneError, which is not whitespace.
func hasOuterSpace(s string) bool {
	first, _ := utf8.DecodeRuneInString(s)
	last, _ := utf8.DecodeLastRuneInString(s)
	return unicode.IsSpace(first) || unicode.IsSpace(last)
}

// Resolve picks the key a run's tasks are served under. An explicit fairness
// key wins (the caller has already validated it). Without one, the quota key
// stands in, but only if it would itself pass ValidateKey: quota keys have
// looser rules, and an unusable one must not fail the start. Everything else
// lands on DefaultKey.
func Resolve(fairnessKey, quotaKey string) string {
	if fairnessKey != "" {
		return fairnessKey
	}
	if ValidateKey(quotaKey) == nil {
		return quotaKey
	}
	return DefaultKey
}

// EffectiveWeight turns a stored override lookup into the weight a charge
// uses. The default key ignores any override, and a key without one weighs 1.
// The override is trusted: the weight store only holds values that passed
// ValidateWeight.
func EffectiveWeight(key string, override float64, ok bool) float64 {
	if key == DefaultKey || !ok {
		return 1
	}
	return override
}
