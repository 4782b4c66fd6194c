package api

import (
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/harvest-run/harvest/pkg/fairkeys"
)

// Limits of a start request.
const (
	MinPriority        = -1000
	MaxPriority        = 1000
	MaxIDBytes         = 255
	MaxNameBytes       = 255
	DefaultMaxAttempts = 3
	MaxMaxAttempts     = 1000
	MaxBatchItems      = 1000
)

// StartRequest is the body of a start, over HTTP and NATS alike. Optional
// fields are pointers so that "absent" differs from a zero value: an explicit
// empty fairness_key is an error, an absent one is not.
type StartRequest struct {
	// ID is the idempotency key, unique per tenant; the gateway makes a
	// UUIDv7 when it is absent.
	ID          string          `json:"id,omitempty"`
	Name        string          `json:"name"`
	Queue       string          `json:"queue"`
	Input       json.RawMessage `json:"input,omitempty"`
	FairnessKey *string         `json:"fairness_key,omitempty"`
	QuotaKey    *string         `json:"quota_key,omitempty"`
	Priority    int             `json:"priority,omitempty"`
	RunAt       *Time           `json:"run_at,omitempty"`
	Delay       *Duration       `json:"delay,omitempty"`
	Timeout     *Duration       `json:"timeout,omitempty"`
	MaxAttempts *int            `json:"max_attempts,omitempty"`
	// Throttle, Debounce and Batch make a start that fires later; ParseDefer
	// reads them into typed specs. A start that sets one of them cannot set
	// FairnessKey, because the run it fires takes the quota key as its key.
	Throttle json.RawMessage `json:"throttle,omitempty"`
	Debounce json.RawMessage `json:"debounce,omitempty"`
	Batch    json.RawMessage `json:"batch,omitempty"`
	// Notify asks for the run's final state on NATS, on
	// harvest.runs.<tenant>.<run_id>, for subscribers of that subject.
	// Without it nothing is published when the run ends, since nobody
	// listens to most runs and each event costs the fleet about a tenth
	// of what running a short task does. A long poll on the run
	// (GET /v1/runs/{id}?wait=, the Go client's Wait) asks for it itself.
	// It is not part of the request's identity: a replay that differs
	// only in Notify is the same start.
	Notify bool `json:"notify,omitempty"`
}

// BatchStartRequest is the body of a batch start.
type BatchStartRequest struct {
	Runs []StartRequest `json:"runs"`
}

// BatchResult is one item's outcome in a batch start: a run or an error.
type BatchResult struct {
	Run   *Run   `json:"run,omitempty"`
	Error *Error `json:"error,omitempty"`
}

// BatchStartResponse lists the results in the order of the request's items.
type BatchStartResponse struct {
	Results []BatchResult `json:"results"`
}

// Deferred reports whether the start fires later (throttle, debounce, batch).
func (r *StartRequest) Deferred() bool {
	return len(r.Throttle) > 0 || len(r.Debounce) > 0 || len(r.Batch) > 0
}

// Key is the run's resolved fairness key.
func (r *StartRequest) Key() string {
	var fk, qk string
	if r.FairnessKey != nil {
		fk = *r.FairnessKey
	}
	if r.QuotaKey != nil {
		qk = *r.QuotaKey
	}
	return fairkeys.Resolve(fk, qk)
}

// Validate checks every rule a start must meet and names the first field at
// fault. It does not look at the database: idempotency and admission come
// later.
func (r *StartRequest) Validate() *Error {
	if r.ID != "" {
		if err := checkText(r.ID, MaxIDBytes); err != "" {
			return Invalid("id", "id %s", err)
		}
	}
	if strings.TrimSpace(r.Name) == "" {
		return Invalid("name", "name is required")
	}
	if err := checkText(r.Name, MaxNameBytes); err != "" {
		return Invalid("name", "name %s", err)
	}
	if r.Queue == "" {
		return Invalid("queue", "queue is required")
	}
	if err := fairkeys.ValidateQueueName(r.Queue); err != nil {
		return Invalid("queue", "queue %v", err)
	}
	if r.FairnessKey != nil {
		if err := fairkeys.ValidateKey(*r.FairnessKey); err != nil {
			return Invalid("fairness_key", "fairness_key %v", err)
		}
		if r.Deferred() {
			return Invalid("fairness_key", "fairness_key cannot be set on a throttled, debounced or batched start: such a start fires later and its run takes the quota key as its fairness key")
		}
	}
	if r.QuotaKey != nil {
		if err := fairkeys.ValidateQuotaKey(*r.QuotaKey); err != nil {
			return Invalid("quota_key", "quota_key %v", err)
		}
	}
	if r.Priority < MinPriority || r.Priority > MaxPriority {
		return Invalid("priority", "priority must be an integer from %d to %d, got %d", MinPriority, MaxPriority, r.Priority)
	}
	if r.RunAt != nil && r.Delay != nil {
		return Invalid("delay", "set run_at or delay, not both")
	}
	if r.Delay != nil && *r.Delay < 0 {
		return Invalid("delay", "delay must not be negative")
	}
	if r.Timeout != nil && *r.Timeout <= 0 {
		return Invalid("timeout", "timeout must be positive")
	}
	if r.MaxAttempts != nil && (*r.MaxAttempts < 1 || *r.MaxAttempts > MaxMaxAttempts) {
		return Invalid("max_attempts", "max_attempts must be from 1 to %d, got %d", MaxMaxAttempts, *r.MaxAttempts)
	}
	if len(r.Input) > 0 && !json.Valid(r.Input) {
		return Invalid("input", "input is not valid JSON")
	}
	return nil
}

// checkText returns what is wrong with an identifier-like text (a run's
// id or name), or "". Ids and names are shown beside keys and queues (the
// console, the CLI, logs), so they are held to the keys' character rule:
// no control character and no bidirectional control, with which one name
// could be drawn as another.
func checkText(s string, maxBytes int) string {
	switch {
	case len(s) > maxBytes:
		return "must be at most " + strconv.Itoa(maxBytes) + " bytes"
	case !utf8.ValidString(s):
		return "must be valid UTF-8"
	}
	if err := fairkeys.ValidateChars(s); err != nil {
		return err.Error()
	}
	return ""
}
