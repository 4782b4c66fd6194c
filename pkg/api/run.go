package api

import "encoding/json"

// Status is where a run stands.
type Status string

// The run statuses. Completed, failed and cancelled are final.
const (
	StatusDeferred  Status = "deferred"
	StatusQueued    Status = "queued"
	StatusRunning   Status = "running"
	StatusCompleted Status = "completed"
	StatusFailed    Status = "failed"
	StatusCancelled Status = "cancelled"
)

// Final reports whether a run in this status will never change again.
func (s Status) Final() bool {
	return s == StatusCompleted || s == StatusFailed || s == StatusCancelled
}

// Run is the run resource: the reply to a start and to GET /v1/runs/{id}.
// Times come from the database clock.
type Run struct {
	ID          string          `json:"id"`
	Tenant      string          `json:"tenant"`
	Name        string          `json:"name"`
	Queue       string          `json:"queue"`
	Shard       int             `json:"shard"`
	FairnessKey string          `json:"fairness_key"`
	QuotaKey    string          `json:"quota_key"`
	Priority    int             `json:"priority"`
	Status      Status          `json:"status"`
	Attempts    int             `json:"attempts"`
	CreatedAt   Time            `json:"created_at"`
	ClaimedAt   *Time           `json:"claimed_at"`
	FinishedAt  *Time           `json:"finished_at"`
	Output      json.RawMessage `json:"output"`
	Error       *string         `json:"error"`
	// FiresAt is set while the status is deferred: the time the deferred
	// start is due to fire, given the starts known so far (see
	// docs/deferred.md for what can move it in each mode).
	FiresAt *Time `json:"fires_at,omitempty"`
	// RunID is set on the answer for a throttled, debounced or batched
	// start: the id of the run the start fires (or fired). A throttled
	// start fires a run with its own id; the starts of one debounce window
	// or one batch all point at one run with a new id.
	RunID string `json:"run_id,omitempty"`
	// DeferMode is set with RunID: throttle, debounce or batch.
	DeferMode DeferMode `json:"defer_mode,omitempty"`
	// Waiting says why a queued or deferred run is not running yet; only
	// GET /v1/runs/{id} fills it (see RunWaiting).
	Waiting *RunWaiting `json:"waiting,omitempty"`
}
