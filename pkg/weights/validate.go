package weights

import (
	"encoding/json"
	"errors"
	"io"
	"math"
	"strings"
	"unicode/utf8"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/fairkeys"
)

// Limits of quota settings. They keep the numbers inside what the schema
// stores (max_concurrent is a 32-bit integer) and away from values that
// only a typo would produce.
const (
	MaxConcurrentLimit = 1_000_000
	MaxRate            = 1_000_000.0
	MaxBurst           = 1_000_000.0
	// MaxActorBytes caps the actor recorded in audit rows.
	MaxActorBytes = 256
)

// MaxOverrides is the cap on overrides per queue on each shard. The schema
// holds the same number in the check of weight_override_counts.
const MaxOverrides = fairkeys.MaxOverridesPerQueue

// ValidateQueue checks a queue name with the rules of the weight API.
func ValidateQueue(queue string) error {
	if err := fairkeys.ValidateQueueName(queue); err != nil {
		return api.Invalid("queue", "queue %v", err)
	}
	return nil
}

// ValidateOverrideKey checks a key whose weight is to be set or cleared.
// The default key is refused with its own message: it always weighs 1.
func ValidateOverrideKey(key string) error {
	if key == fairkeys.DefaultKey {
		return api.Invalid("key", `the default key ("") cannot be overridden: its weight is always 1`)
	}
	if err := fairkeys.ValidateKey(key); err != nil {
		return api.Invalid("key", "key %v", err)
	}
	return nil
}

// ValidateWeight checks an override's weight: finite, 0.001 to 1000.
func ValidateWeight(w float64) error {
	if err := fairkeys.ValidateWeight(w); err != nil {
		return api.Invalid("weight", "weight %v", err)
	}
	return nil
}

// ValidateQuotaKey checks a quota key with the rules of the start request.
func ValidateQuotaKey(k string) error {
	if err := fairkeys.ValidateQuotaKey(k); err != nil {
		return api.Invalid("quota_key", "quota_key %v", err)
	}
	return nil
}

func validateActor(actor string) error {
	switch {
	case strings.TrimSpace(actor) == "":
		return api.Invalid("actor", "actor must not be blank: audit rows name who made each change")
	case len(actor) > MaxActorBytes:
		return api.Invalid("actor", "actor must be at most %d bytes", MaxActorBytes)
	case !utf8.ValidString(actor):
		return api.Invalid("actor", "actor must be valid UTF-8")
	}
	return nil
}

// Quota is the post-claim rechecks of one (queue, quota key): a concurrency
// cap (tasks of the quota key running at once) and a token-bucket rate
// limit (rate claims per second, bursts of up to burst claims). A nil field
// means no such limit. A write replaces all three fields at once.
type Quota struct {
	MaxConcurrent *int     `json:"max_concurrent"`
	Rate          *float64 `json:"rate"`
	Burst         *float64 `json:"burst"`
}

// Validate checks the settings; the error names the field at fault.
func (q Quota) Validate() error {
	if q.MaxConcurrent == nil && q.Rate == nil && q.Burst == nil {
		return api.Invalid("max_concurrent", "set max_concurrent, or rate and burst, or both; to remove a quota, clear it")
	}
	if q.MaxConcurrent != nil && (*q.MaxConcurrent < 1 || *q.MaxConcurrent > MaxConcurrentLimit) {
		return api.Invalid("max_concurrent", "max_concurrent must be from 1 to %d", MaxConcurrentLimit)
	}
	if (q.Rate == nil) != (q.Burst == nil) {
		if q.Rate == nil {
			return api.Invalid("rate", "rate is required with burst")
		}
		return api.Invalid("burst", "burst is required with rate")
	}
	if q.Rate != nil {
		if r := *q.Rate; math.IsNaN(r) || math.IsInf(r, 0) || r <= 0 || r > MaxRate {
			return api.Invalid("rate", "rate must be a finite number of claims per second above 0 and at most %g", MaxRate)
		}
		if b := *q.Burst; math.IsNaN(b) || math.IsInf(b, 0) || b < 1 || b > MaxBurst {
			return api.Invalid("burst", "burst must be a finite number from 1 to %g", MaxBurst)
		}
	}
	return nil
}

func (q Quota) equal(o Quota) bool {
	eqI := func(a, b *int) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
	eqF := func(a, b *float64) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
	return eqI(q.MaxConcurrent, o.MaxConcurrent) && eqF(q.Rate, o.Rate) && eqF(q.Burst, o.Burst)
}

// WeightBody is the body of PUT /v1/queues/{queue}/weights/{key}.
type WeightBody struct {
	Weight *float64 `json:"weight"`
}

// DecodeWeightBody reads a WeightBody and returns its weight, or an
// *api.Error (400) that names the field at fault.
func DecodeWeightBody(r io.Reader) (float64, error) {
	var b WeightBody
	if err := decodeStrict(r, &b); err != nil {
		return 0, err
	}
	if b.Weight == nil {
		return 0, api.Invalid("weight", "weight is required")
	}
	return *b.Weight, ValidateWeight(*b.Weight)
}

// DecodeQuotaBody reads the body of PUT /v1/queues/{queue}/quotas/{key}
// and validates it, returning an *api.Error (400) on a bad body.
func DecodeQuotaBody(r io.Reader) (Quota, error) {
	var q Quota
	if err := decodeStrict(r, &q); err != nil {
		return Quota{}, err
	}
	return q, q.Validate()
}

func decodeStrict(r io.Reader, v any) error {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) && ute.Field != "" {
			return api.Invalid(ute.Field, "%s must be a %s", ute.Field, ute.Type.Kind())
		}
		return api.NewError(api.CodeInvalidArgument, "bad JSON body: %v", err)
	}
	if dec.More() {
		return api.NewError(api.CodeInvalidArgument, "bad JSON body: %s", "more than one value")
	}
	return nil
}
