package weights

import (
	"encoding/json"
	"errors"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/harvest-run/harvest/pkg/api"
	"github.com/harvest-run/harvest/pkg/fairkeys"
)

// MaxActorBytes caps the actor recorded in audit rows.
const MaxActorBytes = 256

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

// DecodeWeightBody reads a WeightBody and returns its weight, or an
// *api.Error (400) that names the field at fault.
func DecodeWeightBody(r io.Reader) (float64, error) {
	var b api.WeightBody
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
func DecodeQuotaBody(r io.Reader) (api.Quota, error) {
	var q api.Quota
	if err := decodeStrict(r, &q); err != nil {
		return api.Quota{}, err
	}
	return q, q.Validate()
}

// DecodeStrict decodes one JSON value into v, refusing unknown fields, and
// returns an *api.Error (400) naming the field at fault.
func DecodeStrict(r io.Reader, v any) error { return decodeStrict(r, v) }

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
