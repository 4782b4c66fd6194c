package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/harvest-run/harvest/pkg/fairkeys"
)

// Limits of the deferred start modes.
const (
	// MaxDeferPeriod bounds every period and wait of a deferred start: a
	// start that would only fire more than a week later is more likely a
	// unit mistake than a plan.
	MaxDeferPeriod = 7 * 24 * time.Hour
	// MaxThrottleLimit bounds throttle.limit.
	MaxThrottleLimit = 100000
)

// DeferMode names the way a deferred start fires.
type DeferMode string

// The deferred start modes.
const (
	ModeThrottle DeferMode = "throttle"
	ModeDebounce DeferMode = "debounce"
	ModeBatch    DeferMode = "batch"
)

// ThrottleSpec is the throttle field of a start: at most Limit runs start
// per Period for the key; the rest wait, in arrival order.
type ThrottleSpec struct {
	// Key groups the starts that share the limit, within the tenant and the
	// queue. Absent: the default key "" (the whole queue of the tenant).
	Key    string   `json:"key,omitempty"`
	Limit  int      `json:"limit"`
	Period Duration `json:"period"`
}

// DebounceSpec is the debounce field of a start: the run fires Period after
// the last start of the key, with the last start's request, and never later
// than MaxWait after the first start of the window.
type DebounceSpec struct {
	Key    string   `json:"key,omitempty"`
	Period Duration `json:"period"`
	// MaxWait caps the window; absent means no cap (a steady stream of
	// starts keeps postponing the run).
	MaxWait *Duration `json:"max_wait,omitempty"`
}

// BatchSpec is the batch field of a start: starts of one key gather into
// one run whose input is the list of their inputs, fired when MaxSize
// starts have gathered or MaxWait after the first, whichever comes first.
type BatchSpec struct {
	Key     string   `json:"key,omitempty"`
	MaxSize int      `json:"max_size"`
	MaxWait Duration `json:"max_wait"`
}

// DeferSpec is the parsed deferral of a start: exactly one of the three
// specs is set, matching Mode.
type DeferSpec struct {
	Mode     DeferMode
	Throttle *ThrottleSpec
	Debounce *DebounceSpec
	Batch    *BatchSpec
}

// Key is the mode's key (the default key "" when the start gave none).
func (d DeferSpec) Key() string {
	switch {
	case d.Throttle != nil:
		return d.Throttle.Key
	case d.Debounce != nil:
		return d.Debounce.Key
	case d.Batch != nil:
		return d.Batch.Key
	}
	return ""
}

// ParseDefer parses and checks the throttle, debounce or batch field of a
// deferred start. Errors are 400s naming the field at fault, such as
// "throttle.limit". It also refuses what does not combine with a deferral:
// two modes at once, fairness_key (the fired run takes the quota key) and
// run_at or delay (a deferred start decides its own time).
func (r *StartRequest) ParseDefer() (DeferSpec, *Error) {
	var set []DeferMode
	if len(r.Throttle) > 0 {
		set = append(set, ModeThrottle)
	}
	if len(r.Debounce) > 0 {
		set = append(set, ModeDebounce)
	}
	if len(r.Batch) > 0 {
		set = append(set, ModeBatch)
	}
	switch {
	case len(set) == 0:
		return DeferSpec{}, Invalid("throttle", "the start sets none of throttle, debounce and batch")
	case len(set) > 1:
		return DeferSpec{}, Invalid(string(set[1]), "set one of throttle, debounce and batch, not %s and %s", set[0], set[1])
	}
	if r.FairnessKey != nil {
		return DeferSpec{}, Invalid("fairness_key", "fairness_key cannot be set on a throttled, debounced or batched start: its run fires later and takes the quota key as its fairness key")
	}
	if r.RunAt != nil {
		return DeferSpec{}, Invalid("run_at", "run_at cannot be combined with %s: the %s decides when the run starts", set[0], set[0])
	}
	if r.Delay != nil {
		return DeferSpec{}, Invalid("delay", "delay cannot be combined with %s: the %s decides when the run starts", set[0], set[0])
	}
	d := DeferSpec{Mode: set[0]}
	var e *Error
	switch d.Mode {
	case ModeThrottle:
		d.Throttle = &ThrottleSpec{}
		t := d.Throttle
		if e = decodeSpec("throttle", r.Throttle, map[string]any{"key": &t.Key, "limit": &t.Limit, "period": &t.Period}); e == nil {
			e = d.Throttle.check()
		}
	case ModeDebounce:
		d.Debounce = &DebounceSpec{}
		b := d.Debounce
		if e = decodeSpec("debounce", r.Debounce, map[string]any{"key": &b.Key, "period": &b.Period, "max_wait": &b.MaxWait}); e == nil {
			e = d.Debounce.check()
		}
	case ModeBatch:
		d.Batch = &BatchSpec{}
		b := d.Batch
		if e = decodeSpec("batch", r.Batch, map[string]any{"key": &b.Key, "max_size": &b.MaxSize, "max_wait": &b.MaxWait}); e == nil {
			e = d.Batch.check()
		}
	}
	if e != nil {
		return DeferSpec{}, e
	}
	return d, nil
}

// decodeSpec decodes one mode's object field by field, so that an error
// names the exact field at fault ("batch.max_wait"). fields maps each known
// field name to where it is decoded; any other field is refused.
func decodeSpec(mode string, raw json.RawMessage, fields map[string]any) *Error {
	var obj map[string]json.RawMessage
	if t := bytes.TrimSpace(raw); len(t) == 0 || t[0] != '{' || json.Unmarshal(raw, &obj) != nil {
		return Invalid(mode, "%s must be a JSON object", mode)
	}
	names := make([]string, 0, len(obj))
	for name := range obj {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		dst, ok := fields[name]
		if !ok {
			return Invalid(mode+"."+name, "%s has no field %q", mode, name)
		}
		if err := json.Unmarshal(obj[name], dst); err != nil {
			msg := err.Error()
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				msg = "want " + te.Type.String()
			}
			return Invalid(mode+"."+name, "%s.%s: %s", mode, name, strings.TrimPrefix(msg, "json: "))
		}
	}
	return nil
}

func checkDeferKey(field, key string) *Error {
	if key == "" {
		return nil
	}
	if err := fairkeys.ValidateKey(key); err != nil {
		return Invalid(field, "%s %v", field, err)
	}
	return nil
}

func checkPeriod(field string, d Duration) *Error {
	if d <= 0 {
		return Invalid(field, "%s must be a positive duration, such as \"1s\"", field)
	}
	if time.Duration(d) > MaxDeferPeriod {
		return Invalid(field, "%s must be at most %s", field, MaxDeferPeriod)
	}
	return nil
}

func (s *ThrottleSpec) check() *Error {
	if e := checkDeferKey("throttle.key", s.Key); e != nil {
		return e
	}
	if s.Limit < 1 || s.Limit > MaxThrottleLimit {
		return Invalid("throttle.limit", "throttle.limit must be from 1 to %d, got %d", MaxThrottleLimit, s.Limit)
	}
	return checkPeriod("throttle.period", s.Period)
}

func (s *DebounceSpec) check() *Error {
	if e := checkDeferKey("debounce.key", s.Key); e != nil {
		return e
	}
	if e := checkPeriod("debounce.period", s.Period); e != nil {
		return e
	}
	if s.MaxWait != nil {
		if e := checkPeriod("debounce.max_wait", *s.MaxWait); e != nil {
			return e
		}
		if *s.MaxWait < s.Period {
			return Invalid("debounce.max_wait", "debounce.max_wait (%s) must not be shorter than debounce.period (%s)",
				time.Duration(*s.MaxWait), time.Duration(s.Period))
		}
	}
	return nil
}

func (s *BatchSpec) check() *Error {
	if e := checkDeferKey("batch.key", s.Key); e != nil {
		return e
	}
	if s.MaxSize < 1 || s.MaxSize > MaxBatchItems {
		return Invalid("batch.max_size", "batch.max_size must be from 1 to %d, got %d", MaxBatchItems, s.MaxSize)
	}
	return checkPeriod("batch.max_wait", s.MaxWait)
}
