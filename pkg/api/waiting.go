package api

import (
	"fmt"
	"strings"
	"time"
)

// WaitReason says why a queued run has not been claimed yet.
type WaitReason string

// The reasons of RunWaiting, in the order they are checked: the first that
// applies is the one given.
const (
	// WaitNotDue: the run's task is scheduled for later (DueAt).
	WaitNotDue WaitReason = "not_due"
	// WaitQueuePaused: an operator paused the queue on the run's shard
	// (PausedAt; PausedBy for an operator only).
	WaitQueuePaused WaitReason = "queue_paused"
	// WaitNoWorker: no live worker serves the queue on the run's shard.
	WaitNoWorker WaitReason = "no_worker"
	// WaitQuotaConcurrency: the task's quota key already runs as many
	// tasks as its cap allows (QuotaKey, Running, MaxConcurrent).
	WaitQuotaConcurrency WaitReason = "quota_concurrency"
	// WaitQuotaRate: the quota key's rate bucket holds less than one token
	// (QuotaKey, Rate, Burst, Tokens).
	WaitQuotaRate WaitReason = "quota_rate"
	// WaitAdmission: the start is held back before it became a task: a
	// throttled, debounced or batched start (DeferMode, DeferKey,
	// FiresAt, BatchSize), or a run without a task to claim.
	WaitAdmission WaitReason = "admission"
	// WaitFairOrder: in a fair queue, tasks of other fairness keys (and of
	// higher priorities) come first (KeysAhead, ClaimsAhead).
	WaitFairOrder WaitReason = "fair_order"
	// WaitQueueOrder: in a queue served without fairness keys, tasks that
	// come first in the queue's order are ahead (ClaimsAhead).
	WaitQueueOrder WaitReason = "queue_order"
	// WaitNext: nothing holds the run back: the next claim of its queue
	// takes it.
	WaitNext WaitReason = "next"
)

// RunWaiting is why a run that is not running yet waits: the waiting
// object of GET /v1/runs/{id}, set only while the run is queued (or
// deferred). It is a snapshot: it is computed when the run is read, and
// the figures of fair_order are an estimate of the claim order at that
// moment, not a promise.
type RunWaiting struct {
	// Reason is the first of the reasons that applies.
	Reason WaitReason `json:"reason"`

	// DueAt (not_due) is when the task becomes claimable.
	DueAt *Time `json:"due_at,omitempty"`

	// PausedAt (queue_paused) says since when the queue is paused.
	// PausedBy, the operator's token that paused it, is set only where an
	// operator reads the run (the console's operator view): a tenant's
	// answer never names an operator, so over the API it is absent.
	PausedAt *Time  `json:"paused_at,omitempty"`
	PausedBy string `json:"paused_by,omitempty"`

	// LastSeenAt (no_worker) is when a worker last announced the queue on
	// this shard, if one ever did and its row is still kept.
	LastSeenAt *Time `json:"last_seen_at,omitempty"`

	// QuotaKey (quota_concurrency, quota_rate) is the task's quota key.
	QuotaKey string `json:"quota_key,omitempty"`
	// MaxConcurrent and Running (quota_concurrency): the cap and the
	// quota key's running tasks.
	MaxConcurrent int `json:"max_concurrent,omitempty"`
	Running       int `json:"running,omitempty"`
	// Rate, Burst and Tokens (quota_rate): the refill rate in tokens per
	// second, the bucket's size and the tokens it holds now (below 1).
	Rate   float64  `json:"rate,omitempty"`
	Burst  float64  `json:"burst,omitempty"`
	Tokens *float64 `json:"tokens,omitempty"`

	// DeferMode, DeferKey and FiresAt (admission) say what the start
	// waits for: the throttle, debounce or batch of its key and when it
	// is due to fire; BatchSize and BatchMaxSize are a batch's starts so
	// far and the size that fires it at once. Held (admission) says in
	// words what holds a run that has no task.
	DeferMode    DeferMode `json:"defer_mode,omitempty"`
	DeferKey     *string   `json:"defer_key,omitempty"`
	FiresAt      *Time     `json:"fires_at,omitempty"`
	BatchSize    int       `json:"batch_size,omitempty"`
	BatchMaxSize int       `json:"batch_max_size,omitempty"`
	Held         string    `json:"held,omitempty"`

	// FairnessKey (fair_order) is the key the run's task is claimed under.
	FairnessKey *string `json:"fairness_key,omitempty"`
	// KeysAhead (fair_order) is how many other fairness keys have a task
	// that the fair order claims before this run's.
	KeysAhead int `json:"keys_ahead,omitempty"`
	// ClaimsAhead (fair_order, queue_order) is about how many claims of
	// the queue come before this run's.
	ClaimsAhead int `json:"claims_ahead,omitempty"`
	// AtLeast (fair_order, queue_order) says the counts were capped: there
	// are at least that many keys and claims ahead.
	AtLeast bool `json:"at_least,omitempty"`
}

// Summary is the waiting object in one line of English, as the console
// and the CLI show it.
func (w *RunWaiting) Summary() string {
	if w == nil {
		return ""
	}
	atLeast := ""
	if w.AtLeast {
		atLeast = "at least "
	}
	switch w.Reason {
	case WaitNotDue:
		if w.DueAt != nil {
			return "not due yet: scheduled for " + w.DueAt.UTC().Format(time.RFC3339)
		}
		return "not due yet"
	case WaitQueuePaused:
		s := "the queue is paused"
		if w.PausedBy != "" {
			s += " by " + w.PausedBy
		}
		if w.PausedAt != nil {
			s += " since " + w.PausedAt.UTC().Format(time.RFC3339)
		}
		return s
	case WaitNoWorker:
		s := "no live worker serves the queue on this shard"
		if w.LastSeenAt != nil {
			s += " (last seen " + w.LastSeenAt.UTC().Format(time.RFC3339) + ")"
		}
		return s
	case WaitQuotaConcurrency:
		return fmt.Sprintf("quota key %q is at its concurrency cap: %d running of %d", w.QuotaKey, w.Running, w.MaxConcurrent)
	case WaitQuotaRate:
		return fmt.Sprintf("quota key %q is out of rate tokens (rate %g/s, burst %g)", w.QuotaKey, w.Rate, w.Burst)
	case WaitAdmission:
		var parts []string
		if w.DeferMode != "" {
			s := "held by " + string(w.DeferMode)
			if w.DeferKey != nil && *w.DeferKey != "" {
				s += fmt.Sprintf(" of key %q", *w.DeferKey)
			}
			parts = append(parts, s)
		}
		if w.BatchMaxSize > 0 {
			parts = append(parts, fmt.Sprintf("%d of %d starts", w.BatchSize, w.BatchMaxSize))
		}
		if w.FiresAt != nil {
			parts = append(parts, "fires at "+w.FiresAt.UTC().Format(time.RFC3339))
		}
		if w.Held != "" {
			parts = append(parts, w.Held)
		}
		if len(parts) == 0 {
			return "held by admission"
		}
		return strings.Join(parts, ", ")
	case WaitFairOrder:
		key := ""
		if w.FairnessKey != nil {
			key = fmt.Sprintf(" (key %q)", *w.FairnessKey)
		}
		return fmt.Sprintf("behind %s%d other keys in the fair order%s: about %s%d claims ahead",
			atLeast, w.KeysAhead, key, atLeast, w.ClaimsAhead)
	case WaitQueueOrder:
		return fmt.Sprintf("about %s%d claims of the queue ahead", atLeast, w.ClaimsAhead)
	case WaitNext:
		return "next: the queue's next claim takes it"
	}
	return string(w.Reason)
}
